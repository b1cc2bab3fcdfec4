package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// realGateEnv runs the tests of this package that start real Ollama
// servers: make test-integration sets it, the unit stage does not.
const realGateEnv = "VRAMGUARD_REAL_GATE"

// requireRealServers skips t unless the integration stage runs it.
func requireRealServers(t *testing.T) {
	t.Helper()
	if os.Getenv(realGateEnv) != "1" {
		t.Skipf("starts real Ollama servers: make test-integration runs it (%s=1); the unit stage does not", realGateEnv)
	}
}

// chatAnswer is one answer the chat client got from the gate, with the
// orchestrator's epoch when it was sent and when it was answered (odd:
// a reservation stood, that of round (epoch+1)/2; even: none).
type chatAnswer struct {
	code          int    // 200, 503, or another status (0: no answer)
	reason        string // a refusal's reason
	named         string // a refusal's reservation blockers' holders
	before, after int64
	err           error
}

// answerCapture is filled by captureTransport for the request whose
// context carries it.
type answerCapture struct {
	code int
	ref  *refusal
}

type captureKey struct{}

// captureTransport keeps each answer's status and a 503's refusal body for
// the request's capture, as Ollama's own client keeps only the error text.
type captureTransport struct{ base http.RoundTripper }

func (c captureTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := c.base.RoundTrip(req)
	capt, _ := req.Context().Value(captureKey{}).(*answerCapture)
	if err != nil || capt == nil {
		return resp, err
	}
	capt.code = resp.StatusCode
	if resp.StatusCode == http.StatusServiceUnavailable {
		b, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(b))
		var ref refusal
		if rerr == nil && json.Unmarshal(b, &ref) == nil {
			capt.ref = &ref
		}
	}
	return resp, nil
}

// TestHandOverReservedOnRealServers: issue #45 on the four real Ollama
// servers. An orchestrator runs the alternating pipeline (a phase of two
// calls on the small model, a hand-over reserved for the render with the
// fake ComfyUI's process as its recipient, the render, the release, a
// measured Free) on a real server and the fake ComfyUI sharing one PSGPU
// device, while a chat UI on Ollama's own client hammers the gate (in
// process, reading the same device, sharing the orchestrator's lease
// directory) with chats on the larger model, each of which must load it
// (keep_alive 0). The device is sized so that the chat model fits beside
// everything but a reservation. Asserted: no out-of-memory (renders, the
// phase's calls, the chat's answers), every chat sent and answered while a
// reservation stood refused naming it (503, reason "reserved"), and the
// chat client served between reservations.
//
// A chat load the gate admitted before a reservation existed (during the
// hand-over) is still loading when the hand-over reads the device, and no
// reading shows it whole (Ollama lists a model when its load ends): the
// gate reserves it until it lands (ReserveOptions.Load), and the hand-over
// waits for it. The test watches /api/ps during each reservation and fails
// a round in which a chat model appears there.
func TestHandOverReservedOnRealServers(t *testing.T) {
	requireRealServers(t)
	for _, v := range ollamatest.Versions() {
		t.Run("ollama-"+v, func(t *testing.T) {
			s := ollamatest.Require(t, v)
			if err := ollamatest.RegisterModels(t.Context(), s); err != nil {
				t.Fatalf("register models: %v", err)
			}
			handOverOnRealServer(t, s)
		})
	}
}

func handOverOnRealServer(t *testing.T, s *ollamatest.Server) {
	modelA, modelB := ollamatest.ModelA, ollamatest.ModelB
	newClient := func(opts vramguard.Options) *vramguard.OllamaClient {
		opts.Host = s.URL().String()
		tr := http.DefaultTransport.(*http.Transport).Clone()
		t.Cleanup(tr.CloseIdleConnections)
		opts.HTTPClient = &http.Client{Transport: tr}
		opts.PollInterval = 25 * time.Millisecond
		c, err := vramguard.NewClient(opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		})
		return c
	}
	// Sizes as the server lists them and as the library estimates them
	// (newer servers list the stand-in smaller than its estimate).
	probe := newClient(vramguard.Options{})
	sizeOf := func(model string) (listed, est uint64) {
		if _, err := probe.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: model, Prompt: "hi", Options: map[string]any{"num_predict": 1}},
			vramguard.KeepAliveFor(time.Minute), nil); err != nil {
			t.Fatalf("load %s: %v", model, err)
		}
		ps, err := s.Client().ListRunning(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range ps.Models {
			if vramguard.NormalizeModelName(m.Model) == vramguard.NormalizeModelName(model) {
				listed = uint64(m.Size)
			}
		}
		if _, err := probe.UnloadModel(t.Context(), model); err != nil {
			t.Fatalf("unload %s: %v", model, err)
		}
		e, err := probe.EstimateModel(t.Context(), model, 0)
		if err != nil {
			t.Fatal(err)
		}
		return listed, uint64(e.Total)
	}
	listedB, estB := sizeOf(modelB)
	// What stays free beside a reservation: half of the chat model, so
	// that its load needs the reserved room and, landed there, would take
	// more of it than the render can give back by streaming its
	// checkpoint (ckpt): the render would fail for want of its working
	// memory. Between reservations the device holds the chat model
	// beside anything else.
	spare := min(listedB, estB) / 2
	if spare < 32<<10 {
		t.Fatalf("%s lists %d bytes and is estimated at %d; the test needs more than 64 KiB", modelB, listedB, estB)
	}
	ckptBytes, work, ctxBytes := spare/2, spare, uint64(4<<10)
	room := ckptBytes + work + comfyuitest.DynamicVRAMHeadroom
	dev := &vramguardtest.PSGPU{Client: s.Client(), Total: ctxBytes + room + spare}
	fake, err := comfyuitest.NewServer(dev, comfyuitest.Config{
		Models: map[string]uint64{"ckpt.safetensors": ckptBytes}, WorkBytes: work, ContextBytes: ctxBytes,
		StepTime: 50 * time.Millisecond, SettleLag: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	free := comfyui.FreeRequest{Tolerance: 1 << 10, Interval: 20 * time.Millisecond}
	cc, err := comfyui.New(comfyui.Options{URL: fake.URL().String(), VRAM: dev, PID: fake.PID(), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	reader := cc.Reader(dev)
	g := startGate(t, s.URL().String(), reader)
	orch := newClient(vramguard.Options{VRAM: reader, VRAMPollInterval: 20 * time.Millisecond, Budget: &vramguard.Budget{MakeRoom: true},
		Leases: vramguard.LeaseOptions{Dir: g.LeaseDir}})
	if _, err := orch.RegisterTenant(cc.Tenant(comfyui.TenantOptions{Free: free})); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s listed %d bytes, estimated %d; device %d bytes: the render's room %d, %d beside it",
		s.Version(), modelB, listedB, estB, dev.Total, room, spare)

	// epoch counts the orchestrator's reservation windows: odd from
	// Phase.End's return (the reservation taken) to just before its
	// release.
	var epoch atomic.Int64
	// The chat UI: Ollama's own client at the gate, a chat on the larger
	// model with keep_alive 0, so that every request loads it.
	u, err := url.Parse(g.URL)
	if err != nil {
		t.Fatal(err)
	}
	chatTr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(chatTr.CloseIdleConnections)
	chat := api.NewClient(u, &http.Client{Transport: captureTransport{base: chatTr}})
	const maxChats = 2000
	stop := make(chan struct{})
	chatDone := make(chan struct{})
	var answers []chatAnswer
	chatStart := time.Now()
	var chatEnd time.Time
	go func() {
		defer close(chatDone)
		defer func() { chatEnd = time.Now() }()
		noKeep := &api.Duration{Duration: 0}
		stream := false
		for len(answers) < maxChats {
			select {
			case <-stop:
				return
			default:
			}
			capt := &answerCapture{}
			a := chatAnswer{before: epoch.Load()}
			ctx := context.WithValue(t.Context(), captureKey{}, capt)
			a.err = chat.Chat(ctx, &api.ChatRequest{Model: modelB, Messages: []api.Message{{Role: "user", Content: "hi"}},
				KeepAlive: noKeep, Stream: &stream, Options: map[string]any{"num_predict": 2}}, func(api.ChatResponse) error { return nil })
			a.after = epoch.Load()
			a.code = capt.code
			if r := capt.ref; r != nil {
				a.reason = r.Reason
				var named []string
				for _, b := range r.Blockers {
					if b.Kind == "reservation" {
						named = append(named, b.Holder)
					}
				}
				a.named = strings.Join(named, "; ")
			}
			answers = append(answers, a)
			if t.Context().Err() != nil {
				return
			}
			if a.code != http.StatusOK {
				// A chat UI that is refused tries again soon (sooner than
				// the Retry-After: the test hammers).
				select {
				case <-stop:
					return
				case <-time.After(10 * time.Millisecond):
				}
			}
		}
	}()
	stopChat := sync.OnceFunc(func() {
		close(stop)
		<-chatDone
	})
	defer stopChat()

	wf := comfyui.Workflow{
		"4": {ClassType: "CheckpointLoaderSimple", Inputs: map[string]any{"ckpt_name": "ckpt.safetensors"}},
		"5": {ClassType: "EmptyLatentImage", Inputs: map[string]any{"width": 512, "height": 512, "batch_size": 1}},
		"6": {ClassType: "CLIPTextEncode", Inputs: map[string]any{"text": "", "clip": []any{"4", 1}}},
		"3": {ClassType: "KSampler", Inputs: map[string]any{"model": []any{"4", 0}, "positive": []any{"6", 0}, "negative": []any{"6", 0},
			"latent_image": []any{"5", 0}, "seed": 1, "steps": 20, "cfg": 7.0, "sampler_name": "euler", "scheduler": "normal", "denoise": 1.0}},
		"8": {ClassType: "VAEDecode", Inputs: map[string]any{"samples": []any{"3", 0}, "vae": []any{"4", 2}}},
		"9": {ClassType: "SaveImage", Inputs: map[string]any{"images": []any{"8", 0}, "filename_prefix": "it"}},
	}
	const rounds = 5
	var gaps, ends []time.Duration
	landed := 0
	for r := 1; r <= rounds; r++ {
		forWhom := fmt.Sprintf("render %d", r)
		phase, err := orch.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{NeedBytes: room,
			Reserve: vramguard.ReserveOptions{For: forWhom, PID: fake.PID()}})
		if err != nil {
			t.Fatal(err)
		}
		prompt := ""
		for i := range 2 {
			pg := phase.Guard()
			gen, err := pg.Generate(t.Context(), &vramguard.GenerateRequest{Model: modelA, Prompt: "a castle at dawn",
				Options: map[string]any{"num_predict": 4, "temperature": 0.7, "seed": 1}}, nil)
			if err != nil {
				_, _ = phase.End(t.Context())
				t.Fatalf("round %d call %d: %v (kind %v)", r, i, err, vramguard.KindOf(err))
			}
			prompt = gen.Text
		}
		t0 := time.Now()
		rep, err := phase.End(t.Context())
		endTook := time.Since(t0)
		if err != nil || rep.Handover == nil || rep.Handover.FreeAfter < room {
			t.Fatalf("round %d: hand-over %+v, %v (kind %v); want the render's room, verified", r, rep, err, vramguard.KindOf(err))
		}
		res := rep.Handover.Reservation
		epoch.Add(1)
		res0 := time.Now()
		if res != nil {
			res0 = res.Info().Created
		}
		// The device while the reservation stands: a chat load admitted
		// before it and landing after it would be in the reserved room.
		stopWatch, intruded := watchResident(t, s, modelB)
		defer stopWatch() // a failed round's too (idempotent)
		if res == nil {
			t.Errorf("round %d: the hand-over reserved nothing", r)
		} else {
			info := res.Info()
			if info.Bytes != room || info.For != forWhom {
				t.Errorf("round %d: reservation %v; want %d bytes for %s", r, info, room, forWhom)
			}
			if rep.Handover.Snapshot != nil {
				gaps = append(gaps, info.Created.Sub(rep.Handover.Snapshot.Taken))
			}
		}
		ends = append(ends, endTook)
		wf["6"].Inputs["text"] = prompt
		wf["3"].Inputs["seed"] = r // a graph ComfyUI ran already is answered from its cache
		tr := time.Now()
		out, err := cc.Run(t.Context(), wf)
		renderTook := time.Since(tr)
		if err != nil || out.Status != "success" {
			t.Errorf("round %d: render %+v, %v (kind %v); want no out-of-memory", r, out, err, vramguard.KindOf(err))
		}
		stopWatch()
		if n, first := intruded(); n > 0 {
			// A load admitted before the reservation holds one of its own
			// until it lands (ReserveOptions.Load): the hand-over waits for
			// it, so none may land in the reserved room.
			landed++
			t.Errorf("round %d: a chat load landed in the reserved room %v after it was taken (%d readings of /api/ps)",
				r, first.Sub(res0).Round(time.Millisecond), n)
		}
		epoch.Add(1)
		if res != nil {
			if err := res.Release(); err != nil {
				t.Errorf("round %d: release: %v", r, err)
			}
		}
		fr := free
		fr.Wait = true
		rc, err := cc.Free(t.Context(), fr)
		if err != nil || rc.Outcome != comfyui.OutcomeFreed {
			t.Fatalf("round %d: free %v, %v; want a measured freed receipt", r, rc, err)
		}
		t.Logf("%s round %d: End %v (hand-over %v), verified room to reservation %v, render %v",
			s.Version(), r, endTook.Round(time.Millisecond), rep.Handover.Elapsed.Round(time.Millisecond),
			lastOr(gaps), renderTook.Round(time.Millisecond))
	}
	stopChat()

	// Judge the chat client's answers.
	var served, refused, refusedReserved, inWindow, inWindowRefused, other int
	servedBetween := 0
	for i, a := range answers {
		within := a.before == a.after && a.before%2 == 1
		switch {
		case a.code == http.StatusOK && a.err == nil:
			served++
			if a.before == a.after && a.before%2 == 0 {
				servedBetween++
			}
		case a.code == http.StatusServiceUnavailable:
			refused++
			if a.reason == "reserved" {
				refusedReserved++
			}
		default:
			other++
			t.Errorf("chat %d: status %d, %v", i, a.code, a.err)
		}
		if !within {
			continue
		}
		inWindow++
		round := (a.before + 1) / 2
		want := fmt.Sprintf("for render %d", round)
		if a.code == http.StatusServiceUnavailable && a.reason == "reserved" && strings.Contains(a.named, want) {
			inWindowRefused++
		} else {
			t.Errorf("chat %d, sent and answered while render %d's reservation stood: %d (reason %q, reservations named %q, err %v); want refused naming it",
				i, round, a.code, a.reason, a.named, a.err)
		}
	}
	if inWindow == 0 {
		t.Errorf("no chat request was sent and answered within a reservation: the test proved nothing")
	}
	if servedBetween == 0 {
		t.Errorf("the chat client was never served between reservations (%d answers, %d served)", len(answers), served)
	}
	took := chatEnd.Sub(chatStart)
	t.Logf("%s figures: %d rounds; End %v, verified room to reservation %v (medians); chat: %d requests in %v (%.1f/s), %d served (%.2f/s, %d wholly between reservations), %d refused (%d naming the reservation), %d sent and answered within a reservation (%d of them refused naming it); rounds where a load admitted before the reservation landed in it: %d",
		s.Version(), rounds, median(ends).Round(time.Millisecond), median(gaps).Round(10*time.Microsecond), len(answers), took.Round(time.Millisecond),
		float64(len(answers))/took.Seconds(), served, float64(served)/took.Seconds(), servedBetween, refused, refusedReserved, inWindow, inWindowRefused, landed)
	if ps, err := s.Client().ListRunning(t.Context()); err != nil || len(ps.Models) != 0 {
		t.Errorf("after the pipeline /api/ps: %v, %v; want nothing resident", ps, err)
	}
}

// watchResident reads /api/ps every 20 ms until stop is called, counting
// the readings that list model. A failed reading is read again at the
// next tick (Ollama up to v0.32.3 answers some with a bodiless 500).
func watchResident(t *testing.T, s *ollamatest.Server, model string) (stop func(), listed func() (int, time.Time)) {
	done := make(chan struct{})
	exited := make(chan struct{})
	var n atomic.Int64
	var first atomic.Value
	go func() {
		defer close(exited)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			if ps, err := s.Client().ListRunning(t.Context()); err == nil {
				for _, m := range ps.Models {
					if vramguard.NormalizeModelName(m.Model) == vramguard.NormalizeModelName(model) {
						if n.Add(1) == 1 {
							first.Store(time.Now())
						}
					}
				}
			}
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	return sync.OnceFunc(func() { close(done); <-exited }), func() (int, time.Time) {
		f, _ := first.Load().(time.Time)
		return int(n.Load()), f
	}
}

func lastOr(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return ds[len(ds)-1]
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}
