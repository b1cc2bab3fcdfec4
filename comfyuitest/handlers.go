package comfyuitest

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/big"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// comfyMaxBody is aiohttp's client_max_size as ComfyUI sets it
// (--max-upload-size, 100 MB).
const comfyMaxBody = 100 << 20

// serveHTTP routes a request as ComfyUI's aiohttp app does: every route
// also under /api.
func (c *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if p, ok := strings.CutPrefix(path, "/api"); ok && strings.HasPrefix(p, "/") {
		path = p
	}
	method := r.Method
	if method == http.MethodHead {
		method = http.MethodGet
	}
	type route struct {
		method string
		h      func(http.ResponseWriter, *http.Request)
	}
	var routes []route
	switch path {
	case "/prompt":
		routes = []route{{"GET", c.handleGetPrompt}, {"POST", c.handlePostPrompt}}
	case "/queue":
		routes = []route{{"GET", c.handleGetQueue}, {"POST", c.handlePostQueue}}
	case "/history":
		routes = []route{{"GET", c.handleGetHistory}, {"POST", c.handlePostHistory}}
	case "/interrupt":
		routes = []route{{"POST", c.handleInterrupt}}
	case "/free":
		routes = []route{{"POST", c.handleFree}}
	case "/system_stats":
		routes = []route{{"GET", c.handleSystemStats}}
	case "/ws":
		routes = []route{{"GET", c.handleWS}}
	default:
		if id, ok := strings.CutPrefix(path, "/history/"); ok && id != "" && !strings.Contains(id, "/") {
			routes = []route{{"GET", func(w http.ResponseWriter, r *http.Request) { c.handleGetHistoryID(w, id) }}}
		}
		if rest, ok := strings.CutPrefix(path, "/jobs/"); ok && c.cfg.Mode == DynamicVRAM {
			if id, ok := strings.CutSuffix(rest, "/cancel"); ok && id != "" && !strings.Contains(id, "/") {
				routes = []route{{"POST", func(w http.ResponseWriter, r *http.Request) { c.handleCancelJob(w, id) }}}
			}
		}
	}
	if len(routes) == 0 {
		comfyText(w, http.StatusNotFound, "404: Not Found")
		return
	}
	var allow []string
	for _, rt := range routes {
		if rt.method == method {
			rt.h(w, r)
			return
		}
		allow = append(allow, rt.method)
	}
	w.Header().Set("Allow", strings.Join(allow, ","))
	comfyText(w, http.StatusMethodNotAllowed, "405: Method Not Allowed")
}

// comfyText answers a plain-text body, as aiohttp's own errors are.
func comfyText(w http.ResponseWriter, code int, text string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(code)
	_, _ = io.WriteString(w, text)
}

// comfyCrash is aiohttp's answer to an exception in a handler (an invalid
// JSON body, say).
func comfyCrash(w http.ResponseWriter) {
	comfyText(w, http.StatusInternalServerError, "500 Internal Server Error\n\nServer got itself in trouble")
}

// comfyJSON answers web.json_response(v, status=code).
func comfyJSON(w http.ResponseWriter, code int, v any) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		comfyCrash(w)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	_, _ = w.Write(bytes.TrimSuffix(b.Bytes(), []byte("\n")))
}

// comfyOK is web.Response(status=200): no body.
func comfyOK(w http.ResponseWriter) {
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
}

// readJSON is aiohttp's await request.json(): the body parsed by
// json.loads, objects in their order. A body too large is answered here
// (413) and reported with ok false and no error.
func readJSON(w http.ResponseWriter, r *http.Request) (v any, ok bool, err error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, comfyMaxBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		comfyText(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("Maximum request body size %d exceeded, actual body size %d", comfyMaxBody, comfyMaxBody+1))
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	v, err = decodeOrdered(b)
	return v, err == nil, err
}

func (c *Server) handleGetPrompt(w http.ResponseWriter, _ *http.Request) {
	c.mu.Lock()
	info := c.queueInfoLocked()
	c.mu.Unlock()
	comfyJSON(w, http.StatusOK, info)
}

// handlePostPrompt is server.py's post_prompt.
func (c *Server) handlePostPrompt(w http.ResponseWriter, r *http.Request) {
	body, ok, err := readJSON(w, r)
	if err != nil {
		comfyCrash(w)
	}
	if !ok {
		return
	}
	obj, isObj := body.(jsonObj)
	if pyContainsErr(body) {
		comfyCrash(w) // `"number" in json_data` on a number, a bool or None
		return
	}
	var number pyNum
	if v, has := pyGet(body, "number"); has {
		f, err := pyFloatOf(v)
		if !isObj || err != nil {
			comfyCrash(w)
			return
		}
		number = pyFloat(f)
	} else {
		front, hasFront := pyGet(body, "front")
		if hasFront && !isObj {
			comfyCrash(w)
			return
		}
		c.mu.Lock()
		n := c.number
		c.number++
		c.mu.Unlock()
		if hasFront && pyTruthy(front) {
			n = -n
		}
		number = pyInt(n)
	}
	prompt, has := pyGet(body, "prompt")
	if !has {
		comfyJSON(w, http.StatusBadRequest, jsonObj{
			{"error", jsonObj{{"type", "no_prompt"}, {"message", "No prompt provided"}, {"details", "No prompt provided"}, {"extra_info", jsonObj{}}}},
			{"node_errors", jsonObj{}},
		})
		return
	}
	if !isObj {
		comfyCrash(w) // json_data["prompt"] on a list or a string
		return
	}
	id := ""
	if v, ok := obj.get("prompt_id"); ok {
		id = pyStr(v)
		if c.cfg.Mode == DynamicVRAM { // today's server.py (FIELD_NOTES §9)
			if s, isStr := v.(string); !isStr || !canonicalUUID(s) {
				comfyJSON(w, http.StatusBadRequest, jsonObj{
					{"error", jsonObj{{"type", "invalid_prompt_id"}, {"message", "Invalid prompt_id"},
						{"details", "prompt_id must be a lowercase UUID"}, {"extra_info", jsonObj{}}}},
					{"node_errors", jsonObj{}},
				})
				return
			}
			if c.knownID(id) {
				comfyJSON(w, http.StatusConflict, jsonObj{
					{"error", jsonObj{{"type", "prompt_id_exists"}, {"message", "prompt_id already exists"},
						{"details", id}, {"extra_info", jsonObj{}}}},
					{"node_errors", jsonObj{}},
				})
				return
			}
		}
	} else {
		id = newUUID()
	}
	res, exc := c.validate(prompt)
	if exc != nil {
		comfyCrash(w)
		return
	}
	extra := jsonObj{}
	if v, ok := obj.get("extra_data"); ok {
		e, isObj := v.(jsonObj)
		if !isObj {
			comfyCrash(w)
			return
		}
		extra = slices.Clone(e)
	}
	var to *string
	if v, ok := obj.get("client_id"); ok {
		extra = extra.set("client_id", v)
	}
	if v, ok := extra.get("client_id"); ok && v != nil {
		sid, isStr := v.(string)
		if !isStr {
			sid = "\x00" + pyRepr(v) // not None, but no socket's id
		}
		to = &sid
	}
	if !res.ok {
		comfyJSON(w, http.StatusBadRequest, jsonObj{{"error", res.err}, {"node_errors", res.nodeErrors}})
		return
	}
	it := &comfyItem{number: number, id: id, prompt: prompt.(jsonObj), extra: extra, outputs: res.outputs, to: to, graph: res.graph}
	c.mu.Lock()
	c.pushLocked(it)
	c.eventLocked(PromptQueued, id, number.String())
	c.queueUpdatedLocked()
	c.mu.Unlock()
	c.signal()
	comfyJSON(w, http.StatusOK, jsonObj{{"prompt_id", id}, {"number", number}, {"node_errors", res.nodeErrors}})
}

// canonicalUUID says whether s is a UUID in canonical lowercase form
// (8-4-4-4-12 hex digits), the only client prompt_id today's ComfyUI takes.
func canonicalUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i, r := range s {
		switch i {
		case 8, 13, 18, 23:
			if r != '-' {
				return false
			}
		default:
			if !('0' <= r && r <= '9' || 'a' <= r && r <= 'f') {
				return false
			}
		}
	}
	return true
}

// knownID says whether a prompt with id is queued, running or in the
// history.
func (c *Server) knownID(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running != nil && c.running.id == id {
		return true
	}
	return slices.ContainsFunc(c.queue, func(it *comfyItem) bool { return it.id == id }) ||
		slices.ContainsFunc(c.history, func(h *comfyHistory) bool { return h.item.id == id })
}

// handleCancelJob is POST /api/jobs/{id}/cancel (today's server.py,
// FIELD_NOTES §9): a queued prompt leaves the queue, the running one is
// interrupted; {"cancelled": false} for a prompt that is neither.
func (c *Server) handleCancelJob(w http.ResponseWriter, id string) {
	c.mu.Lock()
	cancelled := false
	switch {
	case c.running != nil && c.running.id == id:
		c.stop, cancelled = true, true
	default:
		if i := slices.IndexFunc(c.queue, func(it *comfyItem) bool { return it.id == id }); i >= 0 {
			c.queue = slices.Delete(c.queue, i, i+1)
			comfyHeapify(c.queue)
			c.eventLocked(PromptCancelled, id, "")
			c.queueUpdatedLocked()
			cancelled = true
		}
	}
	c.mu.Unlock()
	comfyJSON(w, http.StatusOK, jsonObj{{"cancelled", cancelled}})
}

// newUUID is str(uuid.uuid4()).
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func (c *Server) handleGetQueue(w http.ResponseWriter, _ *http.Request) {
	c.mu.Lock()
	running := []any{}
	if c.running != nil {
		running = append(running, c.running.tuple())
	}
	pending := make([]any, len(c.queue))
	for i, it := range c.queue {
		pending[i] = it.tuple()
	}
	c.mu.Unlock()
	comfyJSON(w, http.StatusOK, jsonObj{{"queue_running", running}, {"queue_pending", pending}})
}

// handlePostQueue is post_queue: {"clear": true} and {"delete": [ids]}.
func (c *Server) handlePostQueue(w http.ResponseWriter, r *http.Request) {
	body, ok, err := readJSON(w, r)
	if err != nil {
		comfyCrash(w)
	}
	if !ok {
		return
	}
	if pyContainsErr(body) {
		comfyCrash(w)
		return
	}
	obj, _ := body.(jsonObj)
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := obj.get("clear"); ok && pyTruthy(v) {
		c.wipeQueueLocked()
	}
	if v, ok := obj.get("delete"); ok {
		ids, isList := v.([]any)
		if !isList {
			comfyCrash(w)
			return
		}
		for _, d := range ids {
			for i, it := range c.queue {
				if s, isStr := d.(string); isStr && it.id == s {
					if len(c.queue) == 1 {
						c.wipeQueueLocked()
					} else {
						c.queue = slices.Delete(c.queue, i, i+1)
						comfyHeapify(c.queue)
					}
					c.queueUpdatedLocked()
					break
				}
			}
		}
	}
	comfyOK(w)
}

func (c *Server) wipeQueueLocked() {
	clear(c.queue)
	c.queue = nil
	c.queueUpdatedLocked()
}

// handleGetHistory is get_history with max_items and offset.
func (c *Server) handleGetHistory(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	maxItems, offset := int64(-1), int64(-1)
	hasMax := q.Has("max_items")
	if hasMax {
		n, err := pyIntParse(q.Get("max_items"))
		if err != nil {
			comfyCrash(w)
			return
		}
		maxItems = n
	}
	if q.Has("offset") {
		n, err := pyIntParse(q.Get("offset"))
		if err != nil {
			comfyCrash(w)
			return
		}
		offset = n
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if offset < 0 && hasMax {
		offset = int64(len(c.history)) - maxItems
	}
	out := jsonObj{}
	for i, h := range c.history {
		if int64(i) >= offset {
			out = append(out, jsonKV{h.item.id, h.json()})
			if hasMax && int64(len(out)) >= maxItems {
				break
			}
		}
	}
	comfyJSON(w, http.StatusOK, out)
}

func (c *Server) handleGetHistoryID(w http.ResponseWriter, id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range c.history {
		if h.item.id == id {
			comfyJSON(w, http.StatusOK, jsonObj{{id, h.json()}})
			return
		}
	}
	comfyJSON(w, http.StatusOK, jsonObj{})
}

// handlePostHistory is post_history: {"clear": true} and {"delete": [ids]}.
func (c *Server) handlePostHistory(w http.ResponseWriter, r *http.Request) {
	body, ok, err := readJSON(w, r)
	if err != nil {
		comfyCrash(w)
	}
	if !ok {
		return
	}
	if pyContainsErr(body) {
		comfyCrash(w)
		return
	}
	obj, _ := body.(jsonObj)
	c.mu.Lock()
	defer c.mu.Unlock()
	if v, ok := obj.get("clear"); ok && pyTruthy(v) {
		c.history = nil
	}
	if v, ok := obj.get("delete"); ok {
		ids, isList := v.([]any)
		if !isList {
			comfyCrash(w)
			return
		}
		for _, d := range ids {
			s, _ := d.(string)
			c.history = slices.DeleteFunc(c.history, func(h *comfyHistory) bool { return h.item.id == s })
		}
	}
	comfyOK(w)
}

// handleInterrupt is post_interrupt: an optional {"prompt_id"} interrupts
// only that prompt, when it is the running one.
func (c *Server) handleInterrupt(w http.ResponseWriter, r *http.Request) {
	body, ok, err := readJSON(w, r)
	if !ok && err == nil {
		return
	}
	if err != nil {
		body = jsonObj{} // json.JSONDecodeError
	}
	obj, isObj := body.(jsonObj)
	if !isObj {
		comfyCrash(w) // json_data.get on a list
		return
	}
	c.mu.Lock()
	if v, ok := obj.get("prompt_id"); ok && pyTruthy(v) {
		if s, isStr := v.(string); isStr && c.running != nil && c.running.id == s {
			c.stop = true
		}
	} else {
		c.stop = true
	}
	c.mu.Unlock()
	comfyOK(w)
}

// handleFree is post_free: it sets the flags and answers at once.
func (c *Server) handleFree(w http.ResponseWriter, r *http.Request) {
	body, ok, err := readJSON(w, r)
	if err != nil {
		comfyCrash(w)
	}
	if !ok {
		return
	}
	obj, isObj := body.(jsonObj)
	if !isObj {
		comfyCrash(w)
		return
	}
	var f comfyFlags
	if v, ok := obj.get("unload_models"); ok && pyTruthy(v) {
		f.unload = true
	}
	if v, ok := obj.get("free_memory"); ok && pyTruthy(v) {
		f.free = true
	}
	c.mu.Lock()
	c.flags.unload = c.flags.unload || f.unload
	c.flags.free = c.flags.free || f.free
	c.eventLocked(FreeRequested, "", f.String())
	c.mu.Unlock()
	if f.set() {
		c.signal()
	}
	comfyOK(w)
}

// handleSystemStats is system_stats, with model_management's CUDA
// figures. It answers StatsDelay late while a free is being applied.
func (c *Server) handleSystemStats(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	slow := c.applying
	c.mu.Unlock()
	if slow && c.cfg.StatsDelay > 0 {
		t := time.NewTimer(c.cfg.StatsDelay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		case <-c.done:
			t.Stop()
			comfyCrash(w)
			return
		}
	}
	total, free, err := c.dev.DeviceMemory(r.Context())
	if err != nil {
		comfyCrash(w)
		return
	}
	h := c.Held()
	// torch's pool: in DynamicVRAM mode the weights are mapped outside it
	// (aimdo's VBARs) and it holds activations, its cache and what custom
	// nodes allocated (FIELD_NOTES §9); in ModelPatcher mode the models too.
	torchTotal := h.Cache + h.Work + h.Pinned
	if c.cfg.Mode == ModelPatcher {
		torchTotal += h.Models
	}
	argv := make([]any, len(c.cfg.Argv))
	for i, a := range c.cfg.Argv {
		argv[i] = a
	}
	comfyJSON(w, http.StatusOK, jsonObj{
		{"system", jsonObj{
			{"os", "posix"},
			{"ram_total", uint64(64 << 30)},
			{"ram_free", uint64(48 << 30)},
			{"comfyui_version", c.cfg.Version},
			{"required_frontend_version", "1.27.10"},
			{"installed_templates_version", "0.1.94"},
			{"required_templates_version", "0.1.94"},
			{"python_version", "3.12.3 (main, Aug 14 2025, 17:47:21) [GCC 13.3.0]"},
			{"pytorch_version", "2.8.0+cu128"},
			{"embedded_python", false},
			{"argv", argv},
		}},
		{"devices", []any{jsonObj{
			{"name", "cuda:0 " + deviceName(c.dev) + " : cudaMallocAsync"},
			{"type", "cuda"},
			{"index", 0},
			{"vram_total", total},
			{"vram_free", free + h.Cache},
			{"torch_vram_total", torchTotal},
			{"torch_vram_free", h.Cache},
		}}},
	})
}

// Node classes.

// comfyInputSpec is one declared input of a node class.
type comfyInputSpec struct {
	name  string
	typ   string // "INT", "FLOAT", "STRING", a link type; "" for a combo
	ckpt  bool   // the combo of checkpoint names; other combos take any value
	extra jsonObj
	min   any // json.Number bounds from extra, nil for none
	max   any
}

// comfyClass is a node class: its required inputs, output types and
// whether it is an output node.
type comfyClass struct {
	inputs  []comfyInputSpec
	returns []string
	output  bool
}

func comfyNum(s string) json.Number { return json.Number(s) }

func comfyIntInput(name, def, lo, hi, tip string, more ...jsonKV) comfyInputSpec {
	extra := jsonObj{{"default", comfyNum(def)}, {"min", comfyNum(lo)}, {"max", comfyNum(hi)}}
	extra = append(extra, more...)
	extra = append(extra, jsonKV{"tooltip", tip})
	return comfyInputSpec{name: name, typ: "INT", extra: extra, min: comfyNum(lo), max: comfyNum(hi)}
}

func comfyFloatInput(name, def, lo, hi string, more jsonObj, tip string) comfyInputSpec {
	extra := jsonObj{{"default", comfyNum(def)}, {"min", comfyNum(lo)}, {"max", comfyNum(hi)}}
	extra = append(extra, more...)
	extra = append(extra, jsonKV{"tooltip", tip})
	return comfyInputSpec{name: name, typ: "FLOAT", extra: extra, min: comfyNum(lo), max: comfyNum(hi)}
}

func comfyTypedInput(name, typ, tip string) comfyInputSpec {
	extra := jsonObj{}
	if tip != "" {
		extra = jsonObj{{"tooltip", tip}}
	}
	return comfyInputSpec{name: name, typ: typ, extra: extra}
}

// comfyBuiltins are the built-in classes the fake knows, with nodes.py's
// inputs (required ones, in declared order), bounds and tooltips. It is a
// read-only table.
var comfyBuiltins = map[string]*comfyClass{
	"CheckpointLoaderSimple": {
		inputs:  []comfyInputSpec{{name: "ckpt_name", ckpt: true, extra: jsonObj{{"tooltip", "The name of the checkpoint (model) to load."}}}},
		returns: []string{"MODEL", "CLIP", "VAE"},
	},
	"CLIPTextEncode": {
		inputs: []comfyInputSpec{
			{name: "text", typ: "STRING", extra: jsonObj{{"multiline", true}, {"dynamicPrompts", true}, {"tooltip", "The text to be encoded."}}},
			comfyTypedInput("clip", "CLIP", "The CLIP model used for encoding the text."),
		},
		returns: []string{"CONDITIONING"},
	},
	"EmptyLatentImage": {
		inputs: []comfyInputSpec{
			comfyIntInput("width", "512", "16", "16384", "The width of the latent images in pixels.", jsonKV{"step", comfyNum("8")}),
			comfyIntInput("height", "512", "16", "16384", "The height of the latent images in pixels.", jsonKV{"step", comfyNum("8")}),
			comfyIntInput("batch_size", "1", "1", "4096", "The number of latent images in the batch."),
		},
		returns: []string{"LATENT"},
	},
	"KSampler": {
		inputs: []comfyInputSpec{
			comfyTypedInput("model", "MODEL", "The model used for denoising the input latent."),
			comfyIntInput("seed", "0", "0", "18446744073709551615", "The random seed used for creating the noise.", jsonKV{"control_after_generate", true}),
			comfyIntInput("steps", "20", "1", "10000", "The number of steps used in the denoising process."),
			comfyFloatInput("cfg", "8.0", "0.0", "100.0", jsonObj{{"step", comfyNum("0.1")}, {"round", comfyNum("0.01")}},
				"The Classifier-Free Guidance scale balances creativity and adherence to the prompt. Higher values result in images more closely matching the prompt however too high values will negatively impact quality."),
			{name: "sampler_name", extra: jsonObj{{"tooltip", "The algorithm used when sampling, this can affect the quality, speed, and style of the generated output."}}},
			{name: "scheduler", extra: jsonObj{{"tooltip", "The scheduler controls how noise is gradually removed to form the image."}}},
			comfyTypedInput("positive", "CONDITIONING", "The conditioning describing the attributes you want to include in the image."),
			comfyTypedInput("negative", "CONDITIONING", "The conditioning describing the attributes you want to exclude from the image."),
			comfyTypedInput("latent_image", "LATENT", "The latent image to denoise."),
			comfyFloatInput("denoise", "1.0", "0.0", "1.0", jsonObj{{"step", comfyNum("0.01")}},
				"The amount of denoising applied, lower values will maintain the structure of the initial image allowing for image to image sampling."),
		},
		returns: []string{"LATENT"},
	},
	"VAEDecode": {
		inputs: []comfyInputSpec{
			comfyTypedInput("samples", "LATENT", "The latent to be decoded."),
			comfyTypedInput("vae", "VAE", "The VAE model used for decoding the latent."),
		},
		returns: []string{"IMAGE"},
	},
	"SaveImage": {
		inputs: []comfyInputSpec{
			comfyTypedInput("images", "IMAGE", "The images to save."),
			{name: "filename_prefix", typ: "STRING", extra: jsonObj{{"default", "ComfyUI"}, {"tooltip", "The prefix for the file to save. This may include formatting information such as %date:yyyy-MM-dd% or %Empty Latent Image.width% to include values from nodes."}}},
		},
		output: true,
	},
	"PreviewImage": {
		inputs: []comfyInputSpec{comfyTypedInput("images", "IMAGE", "")},
		output: true,
	},
}

// comfyModelInput is the input through which a node uses a checkpoint
// (read-only).
var comfyModelInput = map[string]string{"CLIPTextEncode": "clip", "VAEDecode": "vae", "KSampler": "model"}

// comfyNode is one node of a validated graph.
type comfyNode struct {
	id     string
	class  string
	inputs jsonObj
}

func (n *comfyNode) input(name string) any {
	v, _ := n.inputs.get(name)
	return v
}

// intInput is int() of an input validation accepted; 0 otherwise.
func (n *comfyNode) intInput(name string) int64 {
	b, err := pyIntOf(n.input(name))
	if err != nil || !b.IsInt64() {
		return 0
	}
	return b.Int64()
}

// comfyGraph is a validated prompt.
type comfyGraph struct {
	order  []string
	nodes  map[string]*comfyNode
	sigs   map[string]string // node id → input signature (the cache key)
	custom map[string]CustomNode
}

// output reports whether a node is an output node.
func (g *comfyGraph) output(id string) bool {
	n := g.nodes[id]
	if cl := comfyBuiltins[n.class]; cl != nil {
		return cl.output
	}
	return g.custom[n.class].Output
}

// comfyLink reports whether v is a link (is_link): [node id, output index].
func comfyLink(v any) (from string, ok bool) {
	l, isList := v.([]any)
	if !isList || len(l) != 2 {
		return "", false
	}
	from, ok = l[0].(string)
	if _, isNum := l[1].(json.Number); !ok || !isNum {
		return "", false
	}
	return from, true
}

// ckptOf is the checkpoint a node uses through its input, following
// links back through custom nodes to a CheckpointLoaderSimple.
func (g *comfyGraph) ckptOf(n *comfyNode, input string, models map[string]uint64, seen map[string]bool) (string, bool) {
	from, ok := comfyLink(n.input(input))
	if !ok {
		return "", false
	}
	return g.ckptFrom(from, models, seen)
}

func (g *comfyGraph) ckptFrom(id string, models map[string]uint64, seen map[string]bool) (string, bool) {
	n := g.nodes[id]
	if n == nil || seen[id] {
		return "", false
	}
	seen[id] = true
	switch {
	case n.class == "CheckpointLoaderSimple":
		name := pyStr(n.input("ckpt_name"))
		_, ok := models[name]
		return name, ok
	case comfyBuiltins[n.class] == nil: // a custom node: any of its inputs
		for _, kv := range n.inputs {
			if from, ok := comfyLink(kv.V); ok {
				if name, ok := g.ckptFrom(from, models, seen); ok {
					return name, true
				}
			}
		}
	}
	return "", false
}

// batch is how many images a node's images input carries: the
// batch_size of the EmptyLatentImage upstream, else 1.
func (g *comfyGraph) batch(n *comfyNode, seen map[string]bool) int {
	if n == nil || seen[n.id] {
		return 1
	}
	seen[n.id] = true
	if n.class == "EmptyLatentImage" {
		return int(max(1, min(n.intInput("batch_size"), 4096)))
	}
	b := 1
	for _, kv := range n.inputs {
		if from, ok := comfyLink(kv.V); ok {
			b = max(b, g.batch(g.nodes[from], seen))
		}
	}
	return b
}

// signature is CacheKeySetInputSignature's key for a node: its class and
// inputs, a link standing for the signature of the node it reads.
func (g *comfyGraph) signature(id string, memo map[string]string, busy map[string]bool) string {
	if s, ok := memo[id]; ok {
		return s
	}
	n := g.nodes[id]
	if n == nil || busy[id] {
		return "missing:" + id
	}
	busy[id] = true
	keys := make([]string, 0, len(n.inputs))
	vals := map[string]string{}
	for _, kv := range n.inputs {
		if _, dup := vals[kv.K]; !dup {
			keys = append(keys, kv.K)
		}
		if from, ok := comfyLink(kv.V); ok {
			vals[kv.K] = "link(" + g.signature(from, memo, busy) + "," + string(kv.V.([]any)[1].(json.Number)) + ")"
		} else {
			b, _ := json.Marshal(kv.V)
			vals[kv.K] = string(b)
		}
	}
	slices.Sort(keys)
	var sb strings.Builder
	sb.WriteString(n.class)
	for _, k := range keys {
		fmt.Fprintf(&sb, "\x00%q=%s", k, vals[k])
	}
	s := fmt.Sprintf("%s#%x", n.class, sha256.Sum256([]byte(sb.String())))
	delete(busy, id)
	memo[id] = s
	return s
}

// Validation: execution.py's validate_prompt and validate_inputs.

// pyErr is a Python exception raised during validation: one that a
// try in validate_prompt catches, or that escapes it (a 500).
type pyErr struct{ typ, msg string }

func (e *pyErr) Error() string { return e.typ + ": " + e.msg }

// comfyValidation is validate_prompt's result.
type comfyValidation struct {
	ok         bool
	err        jsonObj // the prompt's error, when not ok
	outputs    []string
	nodeErrors jsonObj
	graph      *comfyGraph
}

// comfyValidated is one validate_inputs result.
type comfyValidated struct {
	ok      bool
	reasons []any
}

// comfyValidator holds one validate_prompt's state.
type comfyValidator struct {
	c         *Server
	prompt    jsonObj
	validated map[string]comfyValidated
	order     []string // validated's insertion order
	busy      map[string]bool
}

func (v *comfyValidator) class(name string) (*comfyClass, bool) {
	if cl := comfyBuiltins[name]; cl != nil {
		return cl, true
	}
	if cn, ok := v.c.cfg.CustomNodes[name]; ok {
		return &comfyClass{output: cn.Output}, false
	}
	return nil, false
}

func (v *comfyValidator) setValidated(id string, r comfyValidated) {
	if _, ok := v.validated[id]; !ok {
		v.order = append(v.order, id)
	}
	v.validated[id] = r
}

func comfyPromptError(typ, msg, details string) jsonObj {
	return jsonObj{{"type", typ}, {"message", msg}, {"details", details}, {"extra_info", jsonObj{}}}
}

// validate is validate_prompt. exc is an exception that escapes it.
func (c *Server) validate(prompt any) (res comfyValidation, exc *pyErr) {
	res.nodeErrors = jsonObj{}
	var p jsonObj
	switch t := prompt.(type) {
	case jsonObj:
		p = t
	case []any:
		if len(t) > 0 {
			return res, &pyErr{"TypeError", "list indices must be integers or slices, not str"}
		}
	case string:
		if t != "" {
			return res, &pyErr{"TypeError", "string indices must be integers, not 'str'"}
		}
	default:
		return res, &pyErr{"TypeError", fmt.Sprintf("'%s' object is not iterable", pyTypeName(prompt))}
	}
	var outputs []string
	for _, kv := range p {
		node, isObj := kv.V.(jsonObj)
		var class any
		var has bool
		switch t := kv.V.(type) {
		case jsonObj:
			class, has = node.get("class_type")
		case string:
			if strings.Contains(t, "class_type") {
				return res, &pyErr{"TypeError", "string indices must be integers, not 'str'"}
			}
		case []any:
			if slices.Contains(t, any("class_type")) {
				return res, &pyErr{"TypeError", "list indices must be integers or slices, not str"}
			}
		default:
			return res, &pyErr{"TypeError", fmt.Sprintf("argument of type '%s' is not iterable", pyTypeName(kv.V))}
		}
		if !isObj || !has {
			res.err = comfyPromptError("invalid_prompt", "Cannot execute because a node is missing the class_type property.", fmt.Sprintf("Node ID '#%s'", kv.K))
			return res, nil
		}
		switch class.(type) {
		case []any, jsonObj:
			return res, &pyErr{"TypeError", fmt.Sprintf("unhashable type: '%s'", pyTypeName(class))}
		}
		name, _ := class.(string)
		known, output := false, false
		if cl := comfyBuiltins[name]; cl != nil {
			known, output = true, cl.output
		} else if cn, ok := c.cfg.CustomNodes[name]; ok {
			known, output = true, cn.Output
		}
		if _, isStr := class.(string); !isStr || !known {
			res.err = comfyPromptError("invalid_prompt", fmt.Sprintf("Cannot execute because node %s does not exist.", pyStr(class)), fmt.Sprintf("Node ID '#%s'", kv.K))
			return res, nil
		}
		if output {
			outputs = append(outputs, kv.K)
		}
	}
	if len(outputs) == 0 {
		res.err = comfyPromptError("prompt_no_outputs", "Prompt has no outputs", "")
		return res, nil
	}
	v := &comfyValidator{c: c, prompt: p, validated: map[string]comfyValidated{}, busy: map[string]bool{}}
	type failed struct {
		out     string
		reasons []any
	}
	var errs []failed
	for _, o := range outputs {
		m, err := v.inputs(o)
		if err != nil {
			m = comfyValidated{reasons: []any{jsonObj{
				{"type", "exception_during_validation"}, {"message", "Exception when validating node"}, {"details", err.msg},
				{"extra_info", jsonObj{{"exception_type", err.typ}, {"traceback", comfyTraceback}}},
			}}}
			v.setValidated(o, m)
		}
		if m.ok {
			res.outputs = append(res.outputs, o)
			continue
		}
		errs = append(errs, failed{o, m.reasons})
		for _, id := range v.order {
			r := v.validated[id]
			if r.ok || len(r.reasons) == 0 {
				continue
			}
			i := slices.IndexFunc(res.nodeErrors, func(e jsonKV) bool { return e.K == id })
			if i < 0 {
				node, _ := p.get(id)
				class, _ := node.(jsonObj).get("class_type")
				res.nodeErrors = append(res.nodeErrors, jsonKV{id, jsonObj{{"errors", r.reasons}, {"dependent_outputs", []any{}}, {"class_type", class}}})
				i = len(res.nodeErrors) - 1
			}
			e := res.nodeErrors[i].V.(jsonObj)
			e[1].V = append(e[1].V.([]any), o)
		}
	}
	if len(res.outputs) == 0 {
		var lines []string
		for _, f := range errs {
			for _, r := range f.reasons {
				ro := r.(jsonObj)
				msg, _ := ro.get("message")
				det, _ := ro.get("details")
				lines = append(lines, fmt.Sprintf("%s: %s", pyStr(msg), pyStr(det)))
			}
		}
		res.err = comfyPromptError("prompt_outputs_failed_validation", "Prompt outputs failed validation", strings.Join(lines, "\n"))
		return res, nil
	}
	res.ok = true
	res.graph = c.graph(p)
	return res, nil
}

// comfyTraceback stands for a Python traceback the fake does not have
// (read-only).
var comfyTraceback = []any{"  File \"execution.py\", in validate_inputs\n    (the fake ComfyUI has no Python traceback)\n"}

// graph builds the execution graph of a validated prompt.
func (c *Server) graph(p jsonObj) *comfyGraph {
	g := &comfyGraph{nodes: map[string]*comfyNode{}, sigs: map[string]string{}, custom: c.cfg.CustomNodes}
	for _, kv := range p {
		node := kv.V.(jsonObj)
		class, _ := node.get("class_type")
		inputs, _ := node.get("inputs")
		in, _ := inputs.(jsonObj)
		g.order = append(g.order, kv.K)
		g.nodes[kv.K] = &comfyNode{id: kv.K, class: class.(string), inputs: in}
	}
	memo := map[string]string{}
	for _, id := range g.order {
		g.sigs[id] = g.signature(id, memo, map[string]bool{})
	}
	return g
}

// inputs is validate_inputs. A returned *pyErr is an exception, which
// the caller catches.
func (v *comfyValidator) inputs(id string) (comfyValidated, *pyErr) {
	if r, ok := v.validated[id]; ok {
		return r, nil
	}
	if v.busy[id] {
		return comfyValidated{}, &pyErr{"RecursionError", "maximum recursion depth exceeded"}
	}
	v.busy[id] = true
	defer delete(v.busy, id)
	nodeV, _ := v.prompt.get(id)
	node := nodeV.(jsonObj)
	classV, _ := node.get("class_type")
	cl, builtin := v.class(classV.(string))
	inputsV, ok := node.get("inputs")
	if !ok {
		return comfyValidated{}, &pyErr{"KeyError", "'inputs'"}
	}
	inputs, isObj := inputsV.(jsonObj)
	if !isObj {
		return comfyValidated{}, &pyErr{"TypeError", fmt.Sprintf("argument of type '%s' is not iterable", pyTypeName(inputsV))}
	}
	specs := cl.inputs
	if !builtin { // a custom node declares whatever it is given, of any type
		specs = nil
		for _, kv := range inputs {
			specs = append(specs, comfyInputSpec{name: kv.K, typ: "*", extra: jsonObj{}})
		}
	}
	var errs []any
	valid := true
	for _, in := range specs {
		typ := any(in.typ)
		if in.ckpt {
			opts := make([]any, len(v.c.ckpts))
			for i, n := range v.c.ckpts {
				opts[i] = n
			}
			typ = opts
		} else if in.typ == "" {
			typ = []any{} // an unchecked combo
		}
		info := []any{typ, in.extra}
		val, present := inputs.get(in.name)
		if !present {
			errs = append(errs, jsonObj{{"type", "required_input_missing"}, {"message", "Required input is missing"}, {"details", in.name}, {"extra_info", jsonObj{{"input_name", in.name}}}})
			continue
		}
		if l, isList := val.([]any); isList {
			if len(l) != 2 {
				errs = append(errs, jsonObj{{"type", "bad_linked_input"}, {"message", "Bad linked input, must be a length-2 list of [node_id, slot_index]"}, {"details", in.name},
					{"extra_info", jsonObj{{"input_name", in.name}, {"input_config", info}, {"received_value", val}}}})
				continue
			}
			oid, err := v.linkedNode(l[0])
			if err != nil {
				return comfyValidated{}, err
			}
			received, err := v.returnType(oid, l[1])
			if err != nil {
				return comfyValidated{}, err
			}
			if !comfyTypesMatch(received, in) {
				errs = append(errs, jsonObj{{"type", "return_type_mismatch"}, {"message", "Return type mismatch between linked nodes"},
					{"details", fmt.Sprintf("%s, received_type(%s) mismatch input_type(%s)", in.name, received, pyStr(typ))},
					{"extra_info", jsonObj{{"input_name", in.name}, {"input_config", info}, {"received_type", received}, {"linked_node", val}}}})
				continue
			}
			r, err := v.inputs(oid)
			if err != nil {
				valid = false
				v.setValidated(oid, comfyValidated{reasons: []any{jsonObj{
					{"type", "exception_during_inner_validation"}, {"message", "Exception when validating inner node"}, {"details", err.msg},
					{"extra_info", jsonObj{{"input_name", in.name}, {"input_config", info}, {"exception_message", err.msg},
						{"exception_type", err.typ}, {"traceback", comfyTraceback}, {"linked_node", val}}},
				}}})
				continue
			}
			if !r.ok {
				valid = false
			}
			continue
		}
		if o, isObj := val.(jsonObj); isObj {
			if inner, ok := o.get("__value__"); ok {
				val = inner
			}
		}
		switch in.typ {
		case "INT":
			b, err := pyIntOf(val)
			if err != nil {
				errs = append(errs, comfyConvertError(in, info, val, err))
				continue
			}
			val = json.Number(b.String())
		case "FLOAT":
			f, err := pyFloatOf(val)
			if err != nil {
				errs = append(errs, comfyConvertError(in, info, val, err))
				continue
			}
			val = pyFloat(f)
		case "STRING":
			val = pyStr(val)
		}
		if in.min != nil && comfyCompare(val, in.min) < 0 {
			errs = append(errs, jsonObj{{"type", "value_smaller_than_min"}, {"message", fmt.Sprintf("Value %s smaller than min of %s", pyStr(val), pyStr(in.min))},
				{"details", in.name}, {"extra_info", jsonObj{{"input_name", in.name}, {"input_config", info}, {"received_value", val}}}})
			continue
		}
		if in.max != nil && comfyCompare(val, in.max) > 0 {
			errs = append(errs, jsonObj{{"type", "value_bigger_than_max"}, {"message", fmt.Sprintf("Value %s bigger than max of %s", pyStr(val), pyStr(in.max))},
				{"details", in.name}, {"extra_info", jsonObj{{"input_name", in.name}, {"input_config", info}, {"received_value", val}}}})
			continue
		}
		if in.ckpt {
			opts := typ.([]any)
			if !slices.ContainsFunc(opts, func(o any) bool { return pyEqual(o, val) }) {
				var config any = info
				listInfo := pyRepr(opts)
				if len(opts) > 20 {
					listInfo, config = fmt.Sprintf("(list of length %d)", len(opts)), nil
				}
				errs = append(errs, jsonObj{{"type", "value_not_in_list"}, {"message", "Value not in list"},
					{"details", fmt.Sprintf("%s: '%s' not in %s", in.name, pyStr(val), listInfo)},
					{"extra_info", jsonObj{{"input_name", in.name}, {"input_config", config}, {"received_value", val}}}})
				continue
			}
		}
	}
	r := comfyValidated{ok: len(errs) == 0 && valid, reasons: errs}
	if r.reasons == nil {
		r.reasons = []any{}
	}
	v.setValidated(id, r)
	return r, nil
}

// linkedNode is prompt[o_id]: the node a link names.
func (v *comfyValidator) linkedNode(oid any) (string, *pyErr) {
	switch oid.(type) {
	case []any, jsonObj:
		return "", &pyErr{"TypeError", fmt.Sprintf("unhashable type: '%s'", pyTypeName(oid))}
	}
	s, isStr := oid.(string)
	if _, ok := v.prompt.get(s); !isStr || !ok {
		return "", &pyErr{"KeyError", pyRepr(oid)}
	}
	return s, nil
}

// returnType is RETURN_TYPES[index] of a node.
func (v *comfyValidator) returnType(oid string, index any) (string, *pyErr) {
	node, _ := v.prompt.get(oid)
	class, _ := node.(jsonObj).get("class_type")
	cl, builtin := v.class(class.(string))
	var i int64
	switch t := index.(type) {
	case bool:
		if t {
			i = 1
		}
	case json.Number:
		b, ok := new(big.Int).SetString(string(t), 10)
		if !ok {
			return "", &pyErr{"TypeError", "tuple indices must be integers or slices, not float"}
		}
		if !b.IsInt64() {
			return "", &pyErr{"IndexError", "cannot fit 'int' into an index-sized integer"}
		}
		i = b.Int64()
	default:
		return "", &pyErr{"TypeError", fmt.Sprintf("tuple indices must be integers or slices, not %s", pyTypeName(index))}
	}
	if !builtin {
		return "*", nil
	}
	n := int64(len(cl.returns))
	if i < 0 {
		i += n
	}
	if i < 0 || i >= n {
		return "", &pyErr{"IndexError", "tuple index out of range"}
	}
	return cl.returns[i], nil
}

// comfyTypesMatch is validate_node_input, not strict.
func comfyTypesMatch(received string, in comfyInputSpec) bool {
	if in.typ == "" || in.ckpt {
		return false // a combo is a list: never a linked type
	}
	if received == in.typ {
		return true
	}
	split := func(s string) []string {
		var out []string
		for _, t := range strings.Split(s, ",") {
			out = append(out, strings.TrimSpace(t))
		}
		return out
	}
	rs, is := split(received), split(in.typ)
	if slices.Contains(rs, "*") || slices.Contains(is, "*") {
		return true
	}
	for _, r := range rs {
		if slices.Contains(is, r) {
			return true
		}
	}
	return false
}

func comfyConvertError(in comfyInputSpec, info []any, val any, err error) jsonObj {
	return jsonObj{{"type", "invalid_input_type"}, {"message", fmt.Sprintf("Failed to convert an input value to a %s value", in.typ)},
		{"details", fmt.Sprintf("%s, %s, %s", in.name, pyStr(val), err.Error())},
		{"extra_info", jsonObj{{"input_name", in.name}, {"input_config", info}, {"received_value", val}, {"exception_message", err.Error()}}}}
}

// comfyCompare compares two numbers (json.Number or pyNum): -1, 0, 1.
func comfyCompare(a, b any) int {
	toRat := func(v any) *big.Rat {
		switch t := v.(type) {
		case json.Number:
			r, ok := new(big.Rat).SetString(string(t))
			if ok {
				return r
			}
		case pyNum:
			if t.float {
				if math.IsInf(t.f, 0) || math.IsNaN(t.f) {
					return nil
				}
				return new(big.Rat).SetFloat64(t.f)
			}
			return new(big.Rat).SetInt64(t.i)
		}
		return nil
	}
	ra, rb := toRat(a), toRat(b)
	if ra == nil || rb == nil {
		if p, ok := a.(pyNum); ok && math.IsInf(p.f, 0) {
			if p.f > 0 {
				return 1
			}
			return -1
		}
		return 0 // NaN compares false both ways
	}
	return ra.Cmp(rb)
}

// Python values: what ComfyUI's messages print of the JSON it received.

// pyNum is a Python int or float, encoded as Python's json.dumps would.
type pyNum struct {
	f     float64
	float bool
	i     int64
}

func pyInt(i int64) pyNum     { return pyNum{f: float64(i), i: i} }
func pyFloat(f float64) pyNum { return pyNum{f: f, float: true} }

func (n pyNum) MarshalJSON() ([]byte, error) {
	if !n.float {
		return strconv.AppendInt(nil, n.i, 10), nil
	}
	if math.IsInf(n.f, 0) || math.IsNaN(n.f) {
		return []byte("null"), nil
	}
	return []byte(pyFloatRepr(n.f)), nil
}

// String is Python's str().
func (n pyNum) String() string {
	if !n.float {
		return strconv.FormatInt(n.i, 10)
	}
	return pyFloatRepr(n.f)
}

// pyFloatRepr is Python's repr of a float.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if f != 0 && (exp < -4 || exp >= 16) {
		return e
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}

// pyTypeName is type(v).__name__ of a JSON value as Python decodes it.
func pyTypeName(v any) string {
	switch t := v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case string:
		return "str"
	case []any:
		return "list"
	case jsonObj:
		return "dict"
	case json.Number:
		if pyIsFloatLit(string(t)) {
			return "float"
		}
		return "int"
	case pyNum:
		if t.float {
			return "float"
		}
		return "int"
	}
	return "object"
}

func pyIsFloatLit(s string) bool { return strings.ContainsAny(s, ".eE") }

// pyRepr is Python's repr of a JSON value.
func pyRepr(v any) string {
	switch t := v.(type) {
	case nil:
		return "None"
	case bool:
		if t {
			return "True"
		}
		return "False"
	case string:
		return pyQuote(t)
	case json.Number:
		if pyIsFloatLit(string(t)) {
			f, _ := strconv.ParseFloat(string(t), 64)
			return pyFloatRepr(f)
		}
		if b, ok := new(big.Int).SetString(string(t), 10); ok {
			return b.String()
		}
		return string(t)
	case pyNum:
		return t.String()
	case []any:
		parts := make([]string, len(t))
		for i, e := range t {
			parts[i] = pyRepr(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case jsonObj:
		parts := make([]string, len(t))
		for i, kv := range t {
			parts[i] = pyQuote(kv.K) + ": " + pyRepr(kv.V)
		}
		return "{" + strings.Join(parts, ", ") + "}"
	}
	return fmt.Sprint(v)
}

// pyStr is Python's str of a JSON value.
func pyStr(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return pyRepr(v)
}

// pyQuote is Python's repr of a str.
func pyQuote(s string) string {
	q := byte('\'')
	if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
		q = '"'
	}
	var b strings.Builder
	b.WriteByte(q)
	for _, r := range s {
		switch {
		case r == '\\':
			b.WriteString(`\\`)
		case r == rune(q):
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		case r == utf8.RuneError || !strconv.IsPrint(r):
			if r <= 0xff {
				fmt.Fprintf(&b, `\x%02x`, r)
			} else if r <= 0xffff {
				fmt.Fprintf(&b, `\u%04x`, r)
			} else {
				fmt.Fprintf(&b, `\U%08x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(q)
	return b.String()
}

// pyTruthy is Python's bool() of a JSON value.
func pyTruthy(v any) bool {
	switch t := v.(type) {
	case nil:
		return false
	case bool:
		return t
	case string:
		return t != ""
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		return err != nil || f != 0
	case []any:
		return len(t) > 0
	case jsonObj:
		return len(t) > 0
	}
	return true
}

// pyEqual is Python's == for the JSON values a combo compares.
func pyEqual(a, b any) bool {
	sa, okA := a.(string)
	sb, okB := b.(string)
	return okA && okB && sa == sb
}

// pyGet is `key in json_data` and json_data[key] for a decoded body: a
// dict's item, or for a list or a string a membership test (has, no
// value). pyContainsErr reports bodies on which `in` itself raises.
func pyGet(body any, key string) (any, bool) {
	switch t := body.(type) {
	case jsonObj:
		return t.get(key)
	case []any:
		return nil, slices.Contains(t, any(key))
	case string:
		return nil, strings.Contains(t, key)
	}
	return nil, false
}

// pyContainsErr reports whether `"x" in body` raises a TypeError (a
// number, a bool or None).
func pyContainsErr(body any) bool {
	switch body.(type) {
	case jsonObj, []any, string:
		return false
	}
	return true
}

// pyIntParse is int() of a str.
func pyIntParse(s string) (int64, error) {
	b, err := pyIntOfString(s)
	if err != nil {
		return 0, err
	}
	if !b.IsInt64() {
		return 0, errors.New("int too large")
	}
	return b.Int64(), nil
}

func pyIntOfString(s string) (*big.Int, error) {
	t := strings.TrimSpace(s)
	digits := strings.TrimLeft(t, "+-")
	if len(t)-len(digits) > 1 || digits == "" || strings.HasPrefix(digits, "_") || strings.HasSuffix(digits, "_") || strings.Contains(digits, "__") {
		return nil, fmt.Errorf("invalid literal for int() with base 10: %s", pyQuote(s))
	}
	b, ok := new(big.Int).SetString(strings.ReplaceAll(t, "_", ""), 10)
	if !ok {
		return nil, fmt.Errorf("invalid literal for int() with base 10: %s", pyQuote(s))
	}
	return b, nil
}

// pyIntOf is int() of a JSON value.
func pyIntOf(v any) (*big.Int, error) {
	switch t := v.(type) {
	case json.Number:
		if !pyIsFloatLit(string(t)) {
			if b, ok := new(big.Int).SetString(string(t), 10); ok {
				return b, nil
			}
		}
		f, _ := strconv.ParseFloat(string(t), 64)
		return pyIntOf(pyFloat(f))
	case pyNum:
		if !t.float {
			return big.NewInt(t.i), nil
		}
		switch {
		case math.IsInf(t.f, 0):
			return nil, errors.New("cannot convert float infinity to integer")
		case math.IsNaN(t.f):
			return nil, errors.New("cannot convert float NaN to integer")
		}
		b, _ := big.NewFloat(math.Trunc(t.f)).Int(nil)
		return b, nil
	case bool:
		if t {
			return big.NewInt(1), nil
		}
		return big.NewInt(0), nil
	case string:
		return pyIntOfString(t)
	}
	return nil, fmt.Errorf("int() argument must be a string, a bytes-like object or a real number, not '%s'", pyTypeName(v))
}

// pyFloatOf is float() of a JSON value.
func pyFloatOf(v any) (float64, error) {
	switch t := v.(type) {
	case json.Number:
		f, err := strconv.ParseFloat(string(t), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return 0, err
		}
		return f, nil
	case pyNum:
		return t.f, nil
	case bool:
		if t {
			return 1, nil
		}
		return 0, nil
	case string:
		s := strings.ToLower(strings.TrimSpace(t))
		switch strings.TrimLeft(s, "+-") {
		case "inf", "infinity":
			if strings.HasPrefix(s, "-") {
				return math.Inf(-1), nil
			}
			return math.Inf(1), nil
		case "nan":
			return math.NaN(), nil
		}
		f, err := strconv.ParseFloat(strings.ReplaceAll(s, "_", ""), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) || s == "" || strings.HasPrefix(s, "0x") {
			return 0, fmt.Errorf("could not convert string to float: %s", pyQuote(t))
		}
		return f, nil
	}
	return 0, fmt.Errorf("float() argument must be a string or a real number, not '%s'", pyTypeName(v))
}

// Ordered JSON: Python's dicts keep their keys' order, and so do the
// fake's replies and the prompts it stores.

// jsonObj is a JSON object with its keys in order.
type jsonObj []jsonKV

// jsonKV is one member of a jsonObj.
type jsonKV struct {
	K string
	V any
}

func (o jsonObj) get(k string) (any, bool) {
	for _, kv := range o {
		if kv.K == k {
			return kv.V, true
		}
	}
	return nil, false
}

// set replaces k's value in place, or appends it, as a dict's assignment.
func (o jsonObj) set(k string, v any) jsonObj {
	for i := range o {
		if o[i].K == k {
			o[i].V = v
			return o
		}
	}
	return append(o, jsonKV{k, v})
}

func (o jsonObj) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	b.WriteByte('{')
	for i, kv := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		if err := enc.Encode(kv.K); err != nil {
			return nil, err
		}
		b.Truncate(b.Len() - 1) // Encode's newline
		b.WriteByte(':')
		v := kv.V
		if v == nil {
			b.WriteString("null")
			continue
		}
		if err := enc.Encode(v); err != nil {
			return nil, err
		}
		b.Truncate(b.Len() - 1)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

// decodeOrdered is json.loads: objects become jsonObj, numbers
// json.Number; text after the value is an error.
func decodeOrdered(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("extra data")
	}
	return v, nil
}

func decodeValue(dec *json.Decoder) (any, error) {
	t, err := dec.Token()
	if err != nil {
		return nil, err
	}
	d, ok := t.(json.Delim)
	if !ok {
		return t, nil
	}
	switch d {
	case '{':
		o := jsonObj{}
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return nil, err
			}
			v, err := decodeValue(dec)
			if err != nil {
				return nil, err
			}
			o = o.set(k.(string), v)
		}
		_, err = dec.Token()
		return o, err
	case '[':
		a := []any{}
		for dec.More() {
			v, err := decodeValue(dec)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err = dec.Token()
		return a, err
	}
	return nil, fmt.Errorf("unexpected %v", d)
}
