package comfyuitest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/ollama/ollama/api"
	"go.uber.org/goleak"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/vramguardtest"
)

const (
	mib             = 1 << 20
	comfyCtx uint64 = comfyuitest.DefaultContextBytes
	sd15            = "sd15.safetensors"
)

// startComfy returns a fake ComfyUI on dev, closed when the test ends.
func startComfy(t *testing.T, dev comfyuitest.Device, cfg comfyuitest.Config) *comfyuitest.Server {
	t.Helper()
	c, err := comfyuitest.NewServer(dev, cfg)
	if err != nil {
		t.Fatalf("NewComfyUI: %v", err)
	}
	t.Cleanup(c.Close)
	return c
}

// comfyDo sends a request; body is sent as is when a string, as JSON
// otherwise, and not at all when nil.
func comfyDo(t *testing.T, c *comfyuitest.Server, method, path string, body any) (int, []byte) {
	t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(js)
	}
	req, err := http.NewRequestWithContext(t.Context(), method, c.URL().String()+path, r)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out
}

// comfyGet decodes a 200 JSON answer.
func comfyGet(t *testing.T, c *comfyuitest.Server, path string) map[string]any {
	t.Helper()
	code, body := comfyDo(t, c, http.MethodGet, path, nil)
	if code != http.StatusOK {
		t.Fatalf("GET %s: %d %s", path, code, body)
	}
	return decode(t, body)
}

func decode(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("decoding %q: %v", body, err)
	}
	return m
}

// txt2img is the default text-to-image graph in API format.
func txt2img(ckpt string, steps int, text string) map[string]any {
	return map[string]any{
		"4": map[string]any{"class_type": "CheckpointLoaderSimple", "inputs": map[string]any{"ckpt_name": ckpt}},
		"5": map[string]any{"class_type": "EmptyLatentImage", "inputs": map[string]any{"width": 512, "height": 512, "batch_size": 1}},
		"6": map[string]any{"class_type": "CLIPTextEncode", "inputs": map[string]any{"text": text, "clip": []any{"4", 1}}},
		"7": map[string]any{"class_type": "CLIPTextEncode", "inputs": map[string]any{"text": "blurry", "clip": []any{"4", 1}}},
		"3": map[string]any{"class_type": "KSampler", "inputs": map[string]any{
			"model": []any{"4", 0}, "positive": []any{"6", 0}, "negative": []any{"7", 0}, "latent_image": []any{"5", 0},
			"seed": 42, "steps": steps, "cfg": 7.5, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0,
		}},
		"8": map[string]any{"class_type": "VAEDecode", "inputs": map[string]any{"samples": []any{"3", 0}, "vae": []any{"4", 2}}},
		"9": map[string]any{"class_type": "SaveImage", "inputs": map[string]any{"images": []any{"8", 0}, "filename_prefix": "ComfyUI"}},
	}
}

// setInput changes one input of a graph node.
func setInput(g map[string]any, node, input string, v any) map[string]any {
	g[node].(map[string]any)["inputs"].(map[string]any)[input] = v
	return g
}

// queuePrompt posts a graph and returns its prompt_id.
func queuePrompt(t *testing.T, c *comfyuitest.Server, graph map[string]any, clientID string) string {
	t.Helper()
	req := map[string]any{"prompt": graph}
	if clientID != "" {
		req["client_id"] = clientID
	}
	code, body := comfyDo(t, c, http.MethodPost, "/prompt", req)
	if code != http.StatusOK {
		t.Fatalf("POST /prompt: %d %s", code, body)
	}
	id, _ := decode(t, body)["prompt_id"].(string)
	if id == "" {
		t.Fatalf("POST /prompt answered %s: no prompt_id", body)
	}
	return id
}

// comfyWait waits up to 10 s for cond.
func comfyWait(t *testing.T, c *comfyuitest.Server, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := c.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// event returns the n-th (0-based) event of kind, for prompt id when id
// is not empty.
func event(c *comfyuitest.Server, kind comfyuitest.EventKind, id string, n int) (comfyuitest.Event, bool) {
	for _, e := range c.Events() {
		if e.Kind == kind && (id == "" || e.PromptID == id) {
			if n == 0 {
				return e, true
			}
			n--
		}
	}
	return comfyuitest.Event{}, false
}

// waitEvent waits for the n-th event of kind (for prompt id, if set).
func waitEvent(t *testing.T, c *comfyuitest.Server, kind comfyuitest.EventKind, id string, n int) comfyuitest.Event {
	t.Helper()
	var e comfyuitest.Event
	comfyWait(t, c, fmt.Sprintf("%s #%d %s", kind, n, id), func() bool {
		var ok bool
		e, ok = event(c, kind, id, n)
		return ok
	})
	return e
}

// runPrompt queues a graph, waits for its end and returns how it ended.
func runPrompt(t *testing.T, c *comfyuitest.Server, graph map[string]any) (id, outcome string) {
	t.Helper()
	id = queuePrompt(t, c, graph, "")
	return id, waitEvent(t, c, comfyuitest.PromptEnd, id, 0).Detail
}

// history returns the prompt's history entry.
func history(t *testing.T, c *comfyuitest.Server, id string) map[string]any {
	t.Helper()
	h, _ := comfyGet(t, c, "/history/"+id)[id].(map[string]any)
	if h == nil {
		t.Fatalf("no history for %s", id)
	}
	return h
}

// messages returns a history entry's status messages by event name.
func messages(h map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{}
	for _, m := range h["status"].(map[string]any)["messages"].([]any) {
		pair := m.([]any)
		out[pair[0].(string)] = pair[1].(map[string]any)
	}
	return out
}

// process returns what the fake GPU lists for a PID.
func process(t *testing.T, r vramguard.VRAMReader, pid uint32) (vramguard.GPUProcess, bool) {
	t.Helper()
	snap, err := r.Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range snap.Devices[0].Processes {
		if p.PID == pid {
			return p, true
		}
	}
	return vramguard.GPUProcess{}, false
}

func processBytes(t *testing.T, r vramguard.VRAMReader, pid uint32) uint64 {
	t.Helper()
	p, _ := process(t, r, pid)
	return p.UsedBytes
}

// wsMsg is one WebSocket message.
type wsMsg struct {
	Type string         `json:"type"`
	Data map[string]any `json:"data"`
}

func dialWS(t *testing.T, c *comfyuitest.Server, clientID string) *websocket.Conn {
	t.Helper()
	u := "ws" + strings.TrimPrefix(c.URL().String(), "http") + "/ws"
	if clientID != "" {
		u += "?clientId=" + clientID
	}
	conn, _, err := websocket.Dial(t.Context(), u, &websocket.DialOptions{HTTPClient: c.Client()})
	if err != nil {
		t.Fatalf("dial %s: %v", u, err)
	}
	t.Cleanup(func() { conn.CloseNow() })
	return conn
}

func readWS(t *testing.T, conn *websocket.Conn) wsMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	typ, data, err := conn.Read(ctx)
	if err != nil {
		t.Fatalf("reading the socket: %v", err)
	}
	if typ != websocket.MessageText {
		t.Fatalf("a %v message", typ)
	}
	var m wsMsg
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatalf("decoding %s: %v", data, err)
	}
	return m
}

// readUntil reads messages up to and including the first that done accepts.
func readUntil(t *testing.T, conn *websocket.Conn, done func(wsMsg) bool) []wsMsg {
	t.Helper()
	var out []wsMsg
	for {
		m := readWS(t, conn)
		out = append(out, m)
		if done(m) {
			return out
		}
	}
}

func promptDone(id string) func(wsMsg) bool {
	return func(m wsMsg) bool {
		return m.Type == "executing" && m.Data["node"] == nil && m.Data["prompt_id"] == id
	}
}

func queueRemaining(m wsMsg) float64 {
	st, _ := m.Data["status"].(map[string]any)
	ei, _ := st["exec_info"].(map[string]any)
	n, _ := ei["queue_remaining"].(float64)
	return n
}

// /free answers at once, but the memory leaves only once the running
// prompt has ended and the worker has spent SettleLag applying it; the
// GPU lists the process's memory until then.
func TestComfyFreeWaitsForPromptAndSettleLag(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 * gib})
	t.Cleanup(s.Close)
	const steps, step, lag = 40, 25 * time.Millisecond, 400 * time.Millisecond
	c := startComfy(t, s, comfyuitest.Config{
		Models: map[string]uint64{sd15: 4 * gib}, WorkBytes: gib, StepTime: step, SettleLag: lag,
	})
	gpu := s.GPU()
	if p, ok := process(t, gpu, c.PID()); !ok || p.UsedBytes != comfyCtx || p.Command != comfyuitest.DefaultCommand || p.Role != vramguard.RoleOther {
		t.Fatalf("idle process %+v (listed %v); want python main.py holding its CUDA context", p, ok)
	}
	id := queuePrompt(t, c, txt2img(sd15, steps, "a lighthouse"), "")
	comfyWait(t, c, "sampling", func() bool { h := c.Held(); return h.Models == 4*gib && h.Work == gib })

	code, body := comfyDo(t, c, http.MethodPost, "/free", map[string]bool{"unload_models": true})
	if code != http.StatusOK || len(body) != 0 {
		t.Fatalf("POST /free = %d %q; want 200 and no body", code, body)
	}
	busy := comfyCtx + 5*gib // context, model, activations (then torch's cache)
	if got := processBytes(t, gpu, c.PID()); got != busy {
		t.Errorf("right after /free answered, the GPU lists %d bytes for ComfyUI; want %d (nothing freed yet)", got, busy)
	}
	applied := waitEvent(t, c, comfyuitest.FreeApplied, "", 0)
	if got := processBytes(t, gpu, c.PID()); got != busy {
		if _, settled := event(c, comfyuitest.FreeSettled, "", 0); !settled {
			t.Errorf("free applied, not settled: the GPU lists %d bytes; want %d still", got, busy)
		}
	}
	settled := waitEvent(t, c, comfyuitest.FreeSettled, "", 0)

	requested, _ := event(c, comfyuitest.FreeRequested, "", 0)
	end, _ := event(c, comfyuitest.PromptEnd, id, 0)
	if end.Detail != "success" {
		t.Fatalf("the prompt ended %q; want success", end.Detail)
	}
	if !requested.Time.Before(end.Time) || end.Time.After(applied.Time) {
		t.Errorf("free requested %v, prompt ended %v, free applied %v: want requested < ended <= applied",
			requested.Time.Format(time.StampMicro), end.Time.Format(time.StampMicro), applied.Time.Format(time.StampMicro))
	}
	if d := settled.Time.Sub(applied.Time); d < lag {
		t.Errorf("the memory left %v after the free was applied; want at least SettleLag %v", d, lag)
	}
	if want := fmt.Sprintf("released %d bytes", 5*gib); settled.Detail != want {
		t.Errorf("free_settled detail %q; want %q", settled.Detail, want)
	}
	if got := processBytes(t, gpu, c.PID()); got != comfyCtx {
		t.Errorf("after the free settled the GPU lists %d bytes; want the context alone (%d)", got, comfyCtx)
	}
	if h := c.Held(); h != (comfyuitest.Memory{Context: comfyCtx}) {
		t.Errorf("Held() = %+v; want the context alone", h)
	}
}

// Memory a custom node keeps outside model management survives /free,
// even free_memory, and is not allocated twice.
func TestComfyPinnedMemorySurvivesFree(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 * gib})
	t.Cleanup(s.Close)
	c := startComfy(t, s, comfyuitest.Config{
		Models:      map[string]uint64{sd15: 4 * gib},
		CustomNodes: map[string]comfyuitest.CustomNode{"IPAdapterCache": {PinBytes: 512 * mib}},
	})
	g := txt2img(sd15, 2, "a fox")
	g["10"] = map[string]any{"class_type": "IPAdapterCache", "inputs": map[string]any{"model": []any{"4", 0}, "weight": 0.8}}
	setInput(g, "3", "model", []any{"10", 0})
	if _, outcome := runPrompt(t, c, g); outcome != "success" {
		t.Fatalf("prompt ended %q", outcome)
	}
	if h := c.Held(); h.Pinned != 512*mib || h.Models != 4*gib {
		t.Fatalf("Held() = %+v; want 512 MiB pinned and the model", h)
	}
	comfyDo(t, c, http.MethodPost, "/free", map[string]bool{"unload_models": true, "free_memory": true})
	waitEvent(t, c, comfyuitest.FreeSettled, "", 0)
	want := comfyuitest.Memory{Context: comfyCtx, Pinned: 512 * mib}
	if h := c.Held(); h != want {
		t.Errorf("after free_memory Held() = %+v; want %+v", h, want)
	}
	if got := processBytes(t, s.GPU(), c.PID()); got != want.Total() {
		t.Errorf("after free_memory the GPU lists %d bytes; want %d", got, want.Total())
	}
	// The node cache is gone, so everything runs again; the pin stays one.
	if _, outcome := runPrompt(t, c, g); outcome != "success" {
		t.Fatalf("second prompt ended %q; want success (it runs again)", outcome)
	}
	if h := c.Held(); h.Pinned != 512*mib || h.Models != 4*gib {
		t.Errorf("after the second run Held() = %+v; want 512 MiB pinned once and the model", h)
	}
}

// unload_models frees the models but keeps the node cache: an identical
// prompt runs nothing and loads nothing; a changed one loads the model
// again. free_memory drops the node cache too: the same prompt runs again.
func TestComfyUnloadModelsVersusFreeMemory(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 * gib})
	t.Cleanup(s.Close)
	c := startComfy(t, s, comfyuitest.Config{Models: map[string]uint64{sd15: 4 * gib}})
	free := func(n int, flags map[string]bool) {
		t.Helper()
		comfyDo(t, c, http.MethodPost, "/free", flags)
		waitEvent(t, c, comfyuitest.FreeSettled, "", n)
	}
	cached := func(id string) []string {
		t.Helper()
		var ids []string
		for _, n := range messages(history(t, c, id))["execution_cached"]["nodes"].([]any) {
			ids = append(ids, n.(string))
		}
		slices.Sort(ids)
		return ids
	}
	all := []string{"3", "4", "5", "6", "7", "8", "9"}
	g := txt2img(sd15, 2, "a harbour")

	if _, outcome := runPrompt(t, c, g); outcome != "success" {
		t.Fatalf("first run ended %q", outcome)
	}
	id, outcome := runPrompt(t, c, g)
	if outcome != "cached" || !slices.Equal(cached(id), all) {
		t.Errorf("identical prompt: %q, execution_cached %v; want cached, every node", outcome, cached(id))
	}
	if out := history(t, c, id)["outputs"].(map[string]any)["9"]; out == nil {
		t.Errorf("a cached prompt's history has no outputs of node 9")
	}

	free(0, map[string]bool{"unload_models": true})
	if h := c.Held(); h.Models != 0 || h.Cache != 0 {
		t.Fatalf("after unload_models Held() = %+v; want no models, no cache", h)
	}
	if id, outcome = runPrompt(t, c, g); outcome != "cached" || !slices.Equal(cached(id), all) {
		t.Errorf("after unload_models the identical prompt: %q, execution_cached %v; want cached, every node", outcome, cached(id))
	}
	if h := c.Held(); h.Models != 0 {
		t.Errorf("a cached prompt loaded %d bytes of models; want none", h.Models)
	}
	g2 := setInput(txt2img(sd15, 2, "a harbour"), "3", "seed", 7)
	if id, outcome = runPrompt(t, c, g2); outcome != "success" || !slices.Equal(cached(id), []string{"4", "5", "6", "7"}) {
		t.Errorf("new seed: %q, execution_cached %v; want success, the loader, latent and encoders cached", outcome, cached(id))
	}
	if h := c.Held(); h.Models != 4*gib {
		t.Errorf("the sampler ran without its model loaded: Held() = %+v", h)
	}

	free(1, map[string]bool{"free_memory": true})
	if id, outcome = runPrompt(t, c, g2); outcome != "success" || len(cached(id)) != 0 {
		t.Errorf("after free_memory: %q, execution_cached %v; want success, nothing cached", outcome, cached(id))
	}
	if ev, _ := event(c, comfyuitest.FreeApplied, "", 1); ev.Detail != "unload_models free_memory" {
		t.Errorf("free_memory applied as %q; want unload_models free_memory", ev.Detail)
	}
}

// /system_stats counts ComfyUI's own reserved cache as free: a model that
// a later prompt stopped using stays in torch's cache, held on the GPU.
func TestComfySystemStatsCountsCacheAsFree(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 * gib})
	t.Cleanup(s.Close)
	c := startComfy(t, s, comfyuitest.Config{
		Mode:      comfyuitest.ModelPatcher,
		Models:    map[string]uint64{"a.safetensors": 4 * gib, "b.safetensors": 2 * gib},
		WorkBytes: gib, Argv: []string{"main.py", "--listen"},
	})
	if _, outcome := runPrompt(t, c, txt2img("a.safetensors", 2, "x")); outcome != "success" {
		t.Fatal(outcome)
	}
	// The first prompt's cache goes back to the driver at once (no gc yet).
	if e := waitEvent(t, c, comfyuitest.CacheEmptied, "", 0); e.Detail != fmt.Sprintf("released %d bytes", gib) {
		t.Errorf("cache_emptied %q; want the activations' 1 GiB", e.Detail)
	}
	if _, outcome := runPrompt(t, c, txt2img("b.safetensors", 2, "y")); outcome != "success" {
		t.Fatal(outcome)
	}
	// a (4 GiB) went to the cache, b (2) and the activations (1) reused it.
	want := comfyuitest.Memory{Context: comfyCtx, Models: 2 * gib, Cache: 2 * gib}
	if h := c.Held(); h != want {
		t.Fatalf("Held() = %+v; want %+v", h, want)
	}
	if _, again := event(c, comfyuitest.CacheEmptied, "", 1); again {
		t.Errorf("the cache was emptied again within 10 s of the last gc")
	}
	st := comfyGet(t, c, "/system_stats")
	sys := st["system"].(map[string]any)
	if sys["comfyui_version"] != "0.3.64" || sys["os"] != "posix" || !reflect.DeepEqual(sys["argv"], []any{"main.py", "--listen"}) {
		t.Errorf("system %v", sys)
	}
	for _, k := range []string{"ram_total", "ram_free", "required_frontend_version", "installed_templates_version", "required_templates_version", "python_version", "pytorch_version", "embedded_python"} {
		if _, ok := sys[k]; !ok {
			t.Errorf("system has no %s", k)
		}
	}
	devs := st["devices"].([]any)
	if len(devs) != 1 {
		t.Fatalf("%d devices; want the torch device alone", len(devs))
	}
	d := devs[0].(map[string]any)
	_, _, driverFree := s.Memory()
	wantDev := map[string]any{
		"name": "cuda:0 Simulated GPU : cudaMallocAsync", "type": "cuda", "index": 0.0,
		"vram_total": float64(24 * gib), "vram_free": float64(driverFree + 2*gib),
		"torch_vram_total": float64(4 * gib), "torch_vram_free": float64(2 * gib),
	}
	if !reflect.DeepEqual(d, wantDev) {
		t.Errorf("device %v\nwant   %v", d, wantDev)
	}
	snap, _ := s.GPU().Snapshot(t.Context())
	if over := uint64(d["vram_free"].(float64)) - snap.Devices[0].Free; over != 2*gib {
		t.Errorf("vram_free overstates the GPU's free memory by %d; want ComfyUI's cache, 2 GiB", over)
	}
}

// While the worker applies a free, /system_stats answers StatsDelay late;
// before, it answers at once.
func TestComfySystemStatsSlowWhileFreeing(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 * gib})
	t.Cleanup(s.Close)
	const delay = 500 * time.Millisecond
	c := startComfy(t, s, comfyuitest.Config{
		Mode:   comfyuitest.ModelPatcher,
		Models: map[string]uint64{sd15: 4 * gib}, SettleLag: 4 * time.Second, StatsDelay: delay,
	})
	if _, outcome := runPrompt(t, c, txt2img(sd15, 1, "x")); outcome != "success" {
		t.Fatal(outcome)
	}
	stats := func() (time.Duration, map[string]any) {
		t0 := time.Now()
		st := comfyGet(t, c, "/system_stats")
		return time.Since(t0), st["devices"].([]any)[0].(map[string]any)
	}
	if d, _ := stats(); d >= delay {
		t.Errorf("idle, /system_stats took %v; want well under StatsDelay %v", d, delay)
	}
	comfyDo(t, c, http.MethodPost, "/free", map[string]bool{"unload_models": true})
	waitEvent(t, c, comfyuitest.FreeApplied, "", 0)
	d, dev := stats()
	if d < delay || d > delay+5*time.Second {
		t.Errorf("while freeing, /system_stats took %v; want StatsDelay %v (and not seconds more)", d, delay)
	}
	if dev["torch_vram_total"] != float64(4*gib) {
		t.Errorf("before the free settled torch_vram_total = %v; want the model's 4 GiB", dev["torch_vram_total"])
	}
}

// Invalid prompts get validate_prompt's 400 bodies; a body that is not
// JSON gets aiohttp's 500.
func TestComfyPromptValidationErrors(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{})
	t.Cleanup(s.Close)
	c := startComfy(t, s, comfyuitest.Config{Models: map[string]uint64{sd15: gib}})
	noNodeErrors := map[string]any{}
	for _, tc := range []struct {
		name       string
		body       any
		code       int
		err        map[string]any // the whole "error", when set
		errType    string         // else its type
		nodeErrors map[string]any // the whole "node_errors", when set
	}{
		{name: "no prompt", body: map[string]any{"client_id": "x"}, code: 400,
			err:        map[string]any{"type": "no_prompt", "message": "No prompt provided", "details": "No prompt provided", "extra_info": map[string]any{}},
			nodeErrors: noNodeErrors},
		{name: "no class_type", body: map[string]any{"prompt": map[string]any{"3": map[string]any{"inputs": map[string]any{}}}}, code: 400,
			err: map[string]any{"type": "invalid_prompt", "message": "Cannot execute because a node is missing the class_type property.",
				"details": "Node ID '#3'", "extra_info": map[string]any{}},
			nodeErrors: noNodeErrors},
		{name: "unknown class", body: map[string]any{"prompt": map[string]any{"12": map[string]any{"class_type": "UpscaleModelLoader", "inputs": map[string]any{}}}}, code: 400,
			err: map[string]any{"type": "invalid_prompt", "message": "Cannot execute because node UpscaleModelLoader does not exist.",
				"details": "Node ID '#12'", "extra_info": map[string]any{}},
			nodeErrors: noNodeErrors},
		{name: "no output", body: map[string]any{"prompt": map[string]any{"4": map[string]any{"class_type": "CheckpointLoaderSimple", "inputs": map[string]any{"ckpt_name": sd15}}}}, code: 400,
			err:        map[string]any{"type": "prompt_no_outputs", "message": "Prompt has no outputs", "details": "", "extra_info": map[string]any{}},
			nodeErrors: noNodeErrors},
		{name: "checkpoint not in list", body: map[string]any{"prompt": txt2img("sdxl.safetensors", 2, "x")}, code: 400,
			// details lists the failed outputs' own errors: SaveImage has none.
			err: map[string]any{"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation",
				"details": "", "extra_info": map[string]any{}},
			nodeErrors: map[string]any{"4": map[string]any{
				"errors": []any{map[string]any{
					"type": "value_not_in_list", "message": "Value not in list",
					"details": "ckpt_name: 'sdxl.safetensors' not in ['sd15.safetensors']",
					"extra_info": map[string]any{
						"input_name":     "ckpt_name",
						"input_config":   []any{[]any{sd15}, map[string]any{"tooltip": "The name of the checkpoint (model) to load."}},
						"received_value": "sdxl.safetensors",
					},
				}},
				"dependent_outputs": []any{"9"}, "class_type": "CheckpointLoaderSimple",
			}}},
		{name: "steps below min", body: map[string]any{"prompt": txt2img(sd15, 0, "x")}, code: 400, errType: "prompt_outputs_failed_validation",
			nodeErrors: map[string]any{"3": map[string]any{
				"errors": []any{map[string]any{
					"type": "value_smaller_than_min", "message": "Value 0 smaller than min of 1", "details": "steps",
					"extra_info": map[string]any{
						"input_name": "steps", "received_value": 0.0,
						"input_config": []any{"INT", map[string]any{"default": 20.0, "min": 1.0, "max": 10000.0, "tooltip": "The number of steps used in the denoising process."}},
					},
				}},
				"dependent_outputs": []any{"9"}, "class_type": "KSampler",
			}}},
		{name: "not JSON", body: `{"prompt": {`, code: 500},
		{name: "empty body", body: "", code: 500},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := comfyDo(t, c, http.MethodPost, "/prompt", tc.body)
			if code != tc.code {
				t.Fatalf("status %d (%s); want %d", code, body, tc.code)
			}
			if code == 500 {
				if string(body) != "500 Internal Server Error\n\nServer got itself in trouble" {
					t.Errorf("body %q; want aiohttp's", body)
				}
				return
			}
			got := decode(t, body)
			e, _ := got["error"].(map[string]any)
			if tc.err != nil && !reflect.DeepEqual(e, tc.err) {
				t.Errorf("error %v\nwant  %v", e, tc.err)
			}
			if tc.errType != "" && e["type"] != tc.errType {
				t.Errorf("error type %v; want %s", e["type"], tc.errType)
			}
			if tc.nodeErrors != nil && !reflect.DeepEqual(got["node_errors"], tc.nodeErrors) {
				t.Errorf("node_errors %v\nwant        %v", got["node_errors"], tc.nodeErrors)
			}
		})
	}

	t.Run("link to a missing node", func(t *testing.T) {
		g := setInput(txt2img(sd15, 2, "x"), "8", "vae", []any{"42", 2})
		code, body := comfyDo(t, c, http.MethodPost, "/prompt", map[string]any{"prompt": g})
		if code != 400 {
			t.Fatalf("status %d %s; want 400", code, body)
		}
		got := decode(t, body)
		ne, _ := got["node_errors"].(map[string]any)["8"].(map[string]any)
		errs, _ := ne["errors"].([]any)
		if len(errs) != 1 || ne["class_type"] != "VAEDecode" || !reflect.DeepEqual(ne["dependent_outputs"], []any{"9"}) {
			t.Fatalf("node_errors %v; want one error on VAEDecode 8", got["node_errors"])
		}
		e := errs[0].(map[string]any)
		extra := e["extra_info"].(map[string]any)
		if e["type"] != "exception_during_inner_validation" || e["details"] != "'42'" ||
			extra["exception_type"] != "KeyError" || extra["input_name"] != "images" || !reflect.DeepEqual(extra["linked_node"], []any{"8", 0.0}) {
			t.Errorf("error %v; want SaveImage's inner validation of 8 failing with KeyError '42'", e)
		}
	})

	t.Run("one output valid", func(t *testing.T) {
		g := txt2img(sd15, 2, "x")
		g["10"] = map[string]any{"class_type": "PreviewImage", "inputs": map[string]any{"images": []any{"3", 0}}}
		code, body := comfyDo(t, c, http.MethodPost, "/prompt", map[string]any{"prompt": g})
		if code != 200 {
			t.Fatalf("status %d %s; want 200: output 9 is valid", code, body)
		}
		ne, _ := decode(t, body)["node_errors"].(map[string]any)["10"].(map[string]any)
		errs, _ := ne["errors"].([]any)
		if len(errs) != 1 || errs[0].(map[string]any)["type"] != "return_type_mismatch" ||
			errs[0].(map[string]any)["details"] != "images, received_type(LATENT) mismatch input_type(IMAGE)" {
			t.Errorf("node_errors[10] %v; want the LATENT/IMAGE mismatch", ne)
		}
	})
}

// One prompt's messages reach its client in ComfyUI's order, the
// executing with node null last, after the last status; another client
// gets the status broadcasts and progress_state only.
func TestComfyWebSocketOrder(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{})
	t.Cleanup(s.Close)
	c := startComfy(t, s, comfyuitest.Config{Models: map[string]uint64{sd15: gib}})
	mine, other := dialWS(t, c, "tester"), dialWS(t, c, "")
	if m := readWS(t, mine); m.Type != "status" || m.Data["sid"] != "tester" || queueRemaining(m) != 0 {
		t.Fatalf("first message %+v; want status with sid tester, nothing queued", m)
	}
	if m := readWS(t, other); m.Type != "status" || len(m.Data["sid"].(string)) != 32 {
		t.Fatalf("first message of a socket without clientId %+v; want a status with a 32-digit hex sid", m)
	}

	id := queuePrompt(t, c, txt2img(sd15, 3, "a boat"), "tester")
	msgs := readUntil(t, mine, promptDone(id))
	var kinds []string
	var progress []float64
	executing := map[string]int{}
	for i, m := range msgs {
		switch m.Type {
		case "progress_state":
			continue
		case "executing":
			if n, _ := m.Data["node"].(string); n != "" {
				executing[n]++
			}
		case "progress":
			if m.Data["node"] != "3" || m.Data["max"] != 3.0 || executing["3"] != 1 {
				t.Errorf("message %d %+v; want KSampler 3's progress of 3, after its executing", i, m)
			}
			progress = append(progress, m.Data["value"].(float64))
		case "executed":
			img := m.Data["output"].(map[string]any)["images"].([]any)[0].(map[string]any)
			if m.Data["node"] != "9" || executing["9"] != 1 || img["filename"] != "ComfyUI_00001_.png" || img["type"] != "output" {
				t.Errorf("executed %+v; want SaveImage 9's image, after its executing", m.Data)
			}
		}
		if strings.HasPrefix(m.Type, "execution_") {
			if _, ok := m.Data["timestamp"]; !ok || m.Data["prompt_id"] != id {
				t.Errorf("%s %+v has no timestamp or another prompt's id", m.Type, m.Data)
			}
		}
		kinds = append(kinds, m.Type)
	}
	if len(kinds) < 7 || !slices.Equal(kinds[:4], []string{"status", "status", "execution_start", "execution_cached"}) ||
		!slices.Equal(kinds[len(kinds)-3:], []string{"execution_success", "status", "executing"}) {
		t.Fatalf("messages %v; want status, status, execution_start, execution_cached ... execution_success, status, executing", kinds)
	}
	if last := msgs[len(msgs)-2]; queueRemaining(last) != 0 {
		t.Errorf("the status before executing null says %v remaining; want 0", queueRemaining(last))
	}
	for _, n := range []string{"3", "4", "5", "6", "7", "8", "9"} {
		if executing[n] != 1 {
			t.Errorf("node %s executing %d times; want once (%v)", n, executing[n], executing)
		}
	}
	if !slices.Equal(progress, []float64{1, 2, 3}) {
		t.Errorf("progress values %v; want 1 2 3", progress)
	}

	// The other socket: status broadcasts until the queue is empty again.
	seen := 0.0
	for _, m := range readUntil(t, other, func(m wsMsg) bool {
		if m.Type == "status" && queueRemaining(m) > 0 {
			seen = queueRemaining(m)
		}
		return m.Type == "status" && seen > 0 && queueRemaining(m) == 0
	}) {
		if m.Type != "status" && m.Type != "progress_state" {
			t.Errorf("another client got %s %+v", m.Type, m.Data)
		}
	}

	// A new socket with the same clientId takes the messages over.
	again := dialWS(t, c, "tester")
	readWS(t, again) // its status
	id2 := queuePrompt(t, c, txt2img(sd15, 3, "a boat"), "tester")
	var cachedOut bool
	for _, m := range readUntil(t, again, promptDone(id2)) {
		if m.Type == "executed" && m.Data["node"] == "9" {
			cachedOut = true
		}
	}
	if !cachedOut {
		t.Errorf("the cached resubmission sent no executed for its output node")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if _, data, err := mine.Read(ctx); err == nil {
		t.Errorf("the replaced socket still got %s", data)
	}
}

// /interrupt stops the running prompt at its next sampler step; one that
// names another prompt does nothing.
func TestComfyInterrupt(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{})
	t.Cleanup(s.Close)
	const steps = 200
	c := startComfy(t, s, comfyuitest.Config{Models: map[string]uint64{sd15: gib}, WorkBytes: gib, StepTime: 10 * time.Millisecond})
	ws := dialWS(t, c, "cli")
	readWS(t, ws)
	id := queuePrompt(t, c, txt2img(sd15, steps, "a storm"), "cli")
	atStep := func(n float64) func(wsMsg) bool {
		return func(m wsMsg) bool { v, _ := m.Data["value"].(float64); return m.Type == "progress" && v >= n }
	}
	readUntil(t, ws, atStep(2))
	comfyDo(t, c, http.MethodPost, "/interrupt", map[string]string{"prompt_id": "not-running"})
	readUntil(t, ws, atStep(5)) // it goes on
	comfyDo(t, c, http.MethodPost, "/interrupt", map[string]string{"prompt_id": id})
	var got map[string]any
	last := 0.0
	for _, m := range readUntil(t, ws, promptDone(id)) {
		switch m.Type {
		case "execution_interrupted":
			got = m.Data
		case "progress":
			last = m.Data["value"].(float64)
		case "execution_success", "execution_error":
			t.Errorf("an interrupted prompt sent %s", m.Type)
		}
	}
	if got == nil || got["node_id"] != "3" || got["node_type"] != "KSampler" || got["prompt_id"] != id {
		t.Fatalf("execution_interrupted %v; want KSampler 3 of %s", got, id)
	}
	if last >= steps {
		t.Errorf("the sampler ran all %d steps", steps)
	}
	st := history(t, c, id)["status"].(map[string]any)
	msgs := st["messages"].([]any)
	if st["status_str"] != "error" || st["completed"] != false || msgs[len(msgs)-1].([]any)[0] != "execution_interrupted" {
		t.Errorf("history status %v; want error, not completed, ending with execution_interrupted", st)
	}
	if e, _ := event(c, comfyuitest.PromptEnd, id, 0); e.Detail != "interrupted" {
		t.Errorf("prompt_end %q; want interrupted", e.Detail)
	}
	if h := c.Held(); h.Work != 0 {
		t.Errorf("Held() = %+v after the prompt; want no activations", h)
	}
	// An interrupt while idle does not reach the next prompt.
	comfyDo(t, c, http.MethodPost, "/interrupt", nil)
	if _, outcome := runPrompt(t, c, txt2img(sd15, 2, "calm")); outcome != "success" {
		t.Errorf("the prompt after an idle interrupt ended %q", outcome)
	}
}

// On a PSGPU the fake shares the device with a Server's models: in
// ModelPatcher mode a checkpoint that does not fit beside them fails with
// torch's out of memory error, and loads once the Ollama model is gone.
func TestComfyOnPSGPU(t *testing.T) {
	s, api1 := start(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "big", Size: 6 * gib, SizeVRAM: 6 * gib, Chunks: 1}}})
	if r := generate(t.Context(), api1, &api.GenerateRequest{Model: "big", Prompt: "hi", KeepAlive: keepAlive(time.Hour)}); r.err != nil {
		t.Fatal(r.err)
	}
	g := &vramguardtest.PSGPU{Client: api1, Total: 8 * gib, Name: "NVIDIA GeForce RTX 4060"}
	c := startComfy(t, g, comfyuitest.Config{Mode: comfyuitest.ModelPatcher, Models: map[string]uint64{sd15: 4 * gib}, Command: "python3 ComfyUI/main.py"})
	id, outcome := runPrompt(t, c, txt2img(sd15, 2, "x"))
	if outcome != "error" {
		t.Fatalf("a 4 GiB checkpoint beside a 6 GiB model on 8 GiB ended %q; want error", outcome)
	}
	e := messages(history(t, c, id))["execution_error"]
	msg, _ := e["exception_message"].(string)
	if e["exception_type"] != "torch.OutOfMemoryError" || e["node_id"] != "4" ||
		!strings.HasPrefix(msg, "CUDA out of memory. Tried to allocate 4.00 GiB. GPU 0 has a total capacity of 8.00 GiB of which 1.75 GiB is free.") ||
		!strings.HasSuffix(msg, "\nThis error means you ran out of memory on your GPU.\n\nTIPS: If the workflow worked before you might have accidentally set the batch_size to a large number.") {
		t.Errorf("execution_error %v", e)
	}
	if p, ok := process(t, g, c.PID()); !ok || p.UsedBytes != comfyCtx || p.Command != "python3 ComfyUI/main.py" || p.Role != vramguard.RoleOther {
		t.Errorf("after the error the GPU lists %+v (%v); want the context alone, under the configured command", p, ok)
	}
	unload(t, api1, "big")
	waitFor(t, s, 5*time.Second, "big to leave /api/ps", func() bool { return !s.Listed("big") })
	if _, outcome := runPrompt(t, c, txt2img(sd15, 2, "x")); outcome != "success" {
		t.Fatalf("with the GPU free the prompt ended %q", outcome)
	}
	if got := processBytes(t, g, c.PID()); got != comfyCtx+4*gib {
		t.Errorf("the GPU lists %d bytes for ComfyUI; want the context and the checkpoint", got)
	}
	d := comfyGet(t, c, "/system_stats")["devices"].([]any)[0].(map[string]any)
	if d["vram_total"] != float64(8*gib) || d["name"] != "cuda:0 NVIDIA GeForce RTX 4060 : cudaMallocAsync" {
		t.Errorf("device %v", d)
	}
}

// Close, with a prompt running, another queued and a socket open, frees
// everything on the device and leaves no goroutine behind.
func TestComfyCloseReleasesEverything(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 24 * gib})
	t.Cleanup(s.Close)
	c, err := comfyuitest.NewServer(s, comfyuitest.Config{
		Models: map[string]uint64{sd15: 4 * gib}, WorkBytes: gib, StepTime: 50 * time.Millisecond,
		CustomNodes: map[string]comfyuitest.CustomNode{"Pin": {PinBytes: mib, Output: true}},
		SettleLag:   time.Hour, StatsDelay: time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	ws := dialWS(t, c, "x")
	readWS(t, ws)
	g := txt2img(sd15, 1000, "long")
	g["10"] = map[string]any{"class_type": "Pin", "inputs": map[string]any{}}
	queuePrompt(t, c, g, "x")
	queuePrompt(t, c, txt2img(sd15, 1000, "next"), "x")
	comfyWait(t, c, "sampling", func() bool { return c.Held().Work == gib })
	pid := c.PID()
	c.Close()
	c.Close()
	if h := c.Held(); h != (comfyuitest.Memory{}) {
		t.Errorf("Held() after Close = %+v; want nothing", h)
	}
	if _, used, _ := s.Memory(); used != 0 {
		t.Errorf("%d bytes used on the GPU after Close; want 0", used)
	}
	if _, listed := process(t, s.GPU(), pid); listed {
		t.Errorf("the GPU still lists PID %d after Close", pid)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for { // what was sent before Close, then the end
		if _, _, err := ws.Read(ctx); err != nil {
			if ctx.Err() != nil {
				t.Errorf("the socket still open 10 s after Close")
			}
			break
		}
	}
	if _, err := c.Client().Get(c.URL().String() + "/prompt"); err == nil {
		t.Errorf("the server still answers after Close")
	}
}

// The queue runs in heap order: front first, a deleted prompt never.
// GET /queue lists the running prompt and the pending ones.
func TestComfyQueueOrder(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{})
	t.Cleanup(s.Close)
	c := startComfy(t, s, comfyuitest.Config{Models: map[string]uint64{sd15: gib}, StepTime: 20 * time.Millisecond})
	post := func(seed int, front bool) (string, float64) {
		t.Helper()
		req := map[string]any{"prompt": setInput(txt2img(sd15, 10, "x"), "3", "seed", seed)}
		if front {
			req["front"] = true
		}
		code, body := comfyDo(t, c, http.MethodPost, "/prompt", req)
		if code != 200 {
			t.Fatalf("POST /prompt: %d %s", code, body)
		}
		m := decode(t, body)
		return m["prompt_id"].(string), m["number"].(float64)
	}
	a, na := post(1, false)
	waitEvent(t, c, comfyuitest.PromptStart, a, 0)
	b, nb := post(2, false)
	d, nd := post(3, false)
	f, nf := post(4, true)
	if na != 0 || nb != 1 || nd != 2 || nf != -3 {
		t.Errorf("numbers %v %v %v %v; want 0 1 2 -3", na, nb, nd, nf)
	}
	q := comfyGet(t, c, "/queue")
	running, pending := q["queue_running"].([]any), q["queue_pending"].([]any)
	if len(running) != 1 || running[0].([]any)[1] != a || len(pending) != 3 || len(running[0].([]any)) != 5 {
		t.Fatalf("queue %v; want %s running, three pending", q, a)
	}
	if n := comfyGet(t, c, "/prompt")["exec_info"].(map[string]any)["queue_remaining"]; n != 4.0 {
		t.Errorf("queue_remaining %v; want 4, the running prompt included", n)
	}
	comfyDo(t, c, http.MethodPost, "/queue", map[string]any{"delete": []string{d}})
	waitEvent(t, c, comfyuitest.PromptEnd, b, 0)
	var order []string
	for _, e := range c.Events() {
		if e.Kind == comfyuitest.PromptStart {
			order = append(order, e.PromptID)
		}
	}
	if !slices.Equal(order, []string{a, f, b}) {
		t.Errorf("ran %v; want %v (front first, the deleted one never)", order, []string{a, f, b})
	}
	if h := comfyGet(t, c, "/history/"+d); len(h) != 0 {
		t.Errorf("the deleted prompt has a history: %v", h)
	}
	if h := comfyGet(t, c, "/api/history?max_items=2"); len(h) != 2 || h[a] != nil {
		t.Errorf("history?max_items=2 lists %d entries (first %v); want the last two", len(h), h[a] != nil)
	}
}

// Two fakes on one device are two processes, both listed under the
// command given; a context that does not fit fails NewComfyUI.
func TestComfyTwoOnOneDevice(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: gib})
	t.Cleanup(s.Close)
	a := startComfy(t, s, comfyuitest.Config{})
	b := startComfy(t, s, comfyuitest.Config{ContextBytes: 512 * mib})
	if a.PID() == b.PID() || a.PID() == 0 {
		t.Fatalf("PIDs %d and %d; want two", a.PID(), b.PID())
	}
	hs := s.Holders()
	if len(hs) != 2 || hs[0].Name != comfyuitest.DefaultCommand || hs[1].Name != comfyuitest.DefaultCommand {
		t.Errorf("holders %+v; want two python main.py", hs)
	}
	_, err := comfyuitest.NewServer(s, comfyuitest.Config{ContextBytes: 512 * mib})
	var ve *vramguardtest.VRAMError
	if !errors.As(err, &ve) {
		t.Errorf("a third context on a full GPU: %v; want a *VRAMError", err)
	}
	b.Close()
	if hs := s.Holders(); len(hs) != 1 || hs[0].PID != a.PID() {
		t.Errorf("after one Close, holders %+v; want the other alone", hs)
	}
	for _, cfg := range []comfyuitest.Config{
		{StepTime: -1},
		{CustomNodes: map[string]comfyuitest.CustomNode{"KSampler": {}}},
		{Models: map[string]uint64{"": 1}},
	} {
		if c, err := comfyuitest.NewServer(s, cfg); err == nil {
			c.Close()
			t.Errorf("NewComfyUI(%+v) succeeded; want an invalid config", cfg)
		}
	}
	if _, err := comfyuitest.NewServer(nil, comfyuitest.Config{}); err == nil {
		t.Errorf("NewComfyUI without a device succeeded")
	}
}
