package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
)

// unloadTrailer is the trailer of a generation sent with keep_alive 0:
// what the gate verified before it let the done line go.
const unloadTrailer = "X-Vramgate-Unload"

// request is what the gate reads of a generate, chat, embed or OpenAI
// request's body; everything else passes through untouched.
type request struct {
	Model     string            `json:"model"`
	Prompt    string            `json:"prompt"`
	Messages  []json.RawMessage `json:"messages"`
	KeepAlive *api.Duration     `json:"keep_alive"`
	Stream    *bool             `json:"stream"`
	Options   struct {
		NumCtx int `json:"num_ctx"`
	} `json:"options"`
}

// keepAliveZero: the request asks Ollama to unload the model when it
// ends (keep_alive 0, "0", "0s").
func (q *request) keepAliveZero() bool { return q.KeepAlive != nil && q.KeepAlive.Duration == 0 }

// isUnload is Ollama's own test of an unload request: keep_alive 0 and no
// prompt (generate) or no messages (chat), which is what `ollama stop`
// sends.
func (q *request) isUnload(chat bool) bool {
	if chat {
		return q.keepAliveZero() && len(q.Messages) == 0
	}
	return q.keepAliveZero() && q.Prompt == ""
}

func (q *request) streams() bool { return q.Stream == nil || *q.Stream }

// parseRequest reads and decodes a body; false means the answer was
// written.
func (g *gate) parseRequest(w http.ResponseWriter, r *http.Request) ([]byte, *request, bool) {
	body, ok := g.readBody(w, r)
	if !ok {
		return nil, nil, false
	}
	var q request
	if len(bytes.TrimSpace(body)) > 0 {
		if err := json.Unmarshal(body, &q); err != nil {
			writeError(w, http.StatusBadRequest, "malformed JSON body: %s", jsonProblem(err))
			return nil, nil, false
		}
	}
	return body, &q, true
}

// state is what one forwarded request carries to modifyResponse.
type state struct {
	client string
	model  string
	load   bool   // the model was not resident: this request loads it
	cause  string // why it was absent, for a load
	by     string // who or what made it leave
	// admission says what the admission checked, for the reply's header.
	admission string
	loadedFn  func() // the load was answered: the admission's landed
	// look answers, when the admission checked nothing, whether the
	// model was absent as the request went out; ev is the admission's.
	look chan bool
	ev   vramguard.AdmissionEvent
	once sync.Once
	// holdDone: a generation with keep_alive 0, whose done line waits for
	// the verified unload.
	holdDone bool
	fired    bool
}

func (st *state) unlock() {
	st.once.Do(func() {
		if st.loadedFn != nil {
			st.loadedFn()
		}
	})
}

type stateKey struct{}

func stateOf(ctx context.Context) *state {
	st, _ := ctx.Value(stateKey{}).(*state)
	return st
}

// generate handles /api/generate and /api/chat: unloads answered only
// once verified, loads admitted, keep_alive 0 generations held until the
// model is verified gone.
func (g *gate) generate(chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, q, ok := g.parseRequest(w, r)
		if !ok {
			return
		}
		client := clientOf(r)
		if q.Model != "" && q.isUnload(chat) {
			g.unloadReply(w, r, q, chat, client)
			return
		}
		st := &state{client: client, model: q.Model}
		if q.Model != "" && q.keepAliveZero() {
			st.holdDone = true
		}
		g.forward(w, r, body, q, st)
	}
}

// admitted handles the routes that may load a model and that the gate
// only admits: embeddings and the OpenAI-compatible routes.
func (g *gate) admitted(w http.ResponseWriter, r *http.Request) {
	body, q, ok := g.parseRequest(w, r)
	if !ok {
		return
	}
	g.forward(w, r, body, q, &state{client: clientOf(r), model: q.Model})
}

// forward admits the request's load, if it causes one, through the
// library's one door (OllamaClient.Admit: the budget's slots, memory,
// room-making, pending loads and load reservation, with the model counted
// in use while the request runs), and sends it on.
func (g *gate) forward(w http.ResponseWriter, r *http.Request, body []byte, q *request, st *state) {
	defer st.unlock()
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
	if q.Model == "" {
		g.send(w, r, q, st)
		return
	}
	var options map[string]any
	if q.Options.NumCtx > 0 {
		options = map[string]any{"num_ctx": q.Options.NumCtx}
	}
	name := vramguard.NormalizeModelName(q.Model)
	ran := false
	err := g.client.Admit(r.Context(), q.Model, options, g.requester(st.client), func(ctx context.Context, ev vramguard.AdmissionEvent, landed func()) error {
		ran = true
		defer g.markBusy(name)()
		if g.client.BudgetOff() || g.cfg.budget(g.reader) == nil {
			// The admission checked nothing (no budget, or memory alone
			// and no reader): the gate looks whether the request loads
			// the model for its metrics only, beside the request rather
			// than before it (Ollama lists a model only once its load has
			// ended, so a look sent with the request still sees it
			// absent); modifyResponse reads the answer.
			look := make(chan bool, 1)
			go func() {
				resident, err := g.resident(ctx)
				look <- err == nil && !slices.Contains(resident, name)
			}()
			st.look, st.ev = look, ev
		} else {
			g.record(st, ev)
		}
		st.loadedFn = landed
		g.send(w, r.WithContext(ctx), q, st)
		return nil
	})
	switch {
	case ran:
	case vramguard.KindOf(err) == vramguard.KindNotFound:
		// The server does not have it: Ollama answers 404 itself, and
		// nothing was unloaded for it.
		st.admission = "model not found: nothing admitted"
		g.send(w, r, q, st)
	default:
		g.refuse(w, g.refusalOf(name, err), st.client)
	}
}

// record records what the admission of a request did (ev): whether it
// loads the model and why it was absent, the models unloaded for it, the
// X-Vramgate-Admission header.
func (g *gate) record(st *state, ev vramguard.AdmissionEvent) {
	name := vramguard.NormalizeModelName(st.model)
	st.load = ev.Load
	if ev.Load {
		st.cause, st.by = g.causeOf(name)
	}
	for _, e := range ev.Evicted {
		if e.Verified {
			g.noteGone(e.Model, st.client, "made room for "+name)
		}
	}
	st.admission = g.summary(ev)
	g.log.Debug("admitted", "model", name, "client", st.client, "admission", st.admission)
}

// requester names the HTTP client a load is admitted for, in the load's
// host-wide reservation (what other programs see while it loads).
func (g *gate) requester(client string) vramguard.ReserveOptions {
	return vramguard.ReserveOptions{For: orUnnamed(client), Note: "vramgate, for " + orUnnamed(client), TTL: min(g.cfg.leaseMax, time.Hour)}
}

// send forwards the request, and holds a keep_alive 0 generation's done
// line until the model is verified gone (modifyResponse).
func (g *gate) send(w http.ResponseWriter, r *http.Request, q *request, st *state) {
	r = r.WithContext(context.WithValue(r.Context(), stateKey{}, st))
	g.proxy.ServeHTTP(w, r)
	if st.holdDone && !st.fired {
		// The reply ended without its done line (the client left, Ollama
		// failed): the model may still leave on its own, but the gate
		// makes sure, detached from the request and bounded.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), g.cfg.unloadWait)
		defer cancel()
		if _, err := g.verifiedUnload(ctx, q.Model, st.client, "keep_alive 0 (reply cut)"); err != nil && !errors.Is(err, vramguard.ErrLeased) {
			g.log.Warn("unload after a cut keep_alive 0 generation failed", "model", q.Model, "client", st.client, "err", err)
		}
	}
}

// modifyResponse runs when Ollama's reply headers arrive: the load has
// happened (or failed), so the next load may be admitted.
func (g *gate) modifyResponse(resp *http.Response) error {
	st := stateOf(resp.Request.Context())
	if st == nil {
		return nil
	}
	st.unlock()
	if st.look != nil {
		st.ev.Load = <-st.look
		g.record(st, st.ev)
	}
	if st.admission != "" {
		resp.Header.Set("X-Vramgate-Admission", st.admission)
	}
	if resp.StatusCode == http.StatusOK && st.load {
		g.noteLoad(st)
	}
	if st.holdDone && resp.StatusCode == http.StatusOK {
		resp.Header.Del("Content-Length")
		resp.ContentLength = -1
		resp.Trailer = http.Header{unloadTrailer: nil}
		resp.Body = &doneHolder{src: resp.Body, br: bufio.NewReaderSize(resp.Body, 64<<10), onDone: func() {
			st.fired = true
			ctx, cancel := context.WithTimeout(resp.Request.Context(), g.cfg.unloadWait)
			defer cancel()
			rep, err := g.verifiedUnload(ctx, st.model, st.client, "keep_alive 0")
			sum := unloadSummary(rep, err)
			if errors.Is(err, vramguard.ErrLeased) {
				// keep_alive 0 went to Ollama as sent: it unloads the
				// model itself when this request ends, lease or not.
				sum += "; Ollama unloads it at the end of this request (keep_alive 0 was forwarded as sent)"
			}
			resp.Trailer.Set(unloadTrailer, sum)
		}}
	}
	return nil
}

// doneHolder passes a streamed reply through line by line and, before
// the line that says done, calls onDone (the verified unload).
type doneHolder struct {
	src    io.ReadCloser
	br     *bufio.Reader
	onDone func()
	out    []byte
	err    error
	fired  bool
}

func (d *doneHolder) Read(p []byte) (int, error) {
	for len(d.out) == 0 {
		if d.err != nil {
			return 0, d.err
		}
		line, err := d.br.ReadBytes('\n')
		if len(line) > 0 && !d.fired && isDoneLine(line) {
			d.fired = true
			d.onDone()
		}
		d.out, d.err = line, err
	}
	n := copy(p, d.out)
	d.out = d.out[n:]
	return n, nil
}

func (d *doneHolder) Close() error { return d.src.Close() }

// isDoneLine: the line is a reply object with "done": true.
func isDoneLine(line []byte) bool {
	if !bytes.Contains(line, []byte(`"done"`)) {
		return false
	}
	var v struct {
		Done bool `json:"done"`
	}
	return json.Unmarshal(line, &v) == nil && v.Done
}

// noteLoad records a load that went through the gate: the metric and the
// INFO line say which client caused it and why the model had left.
func (g *gate) noteLoad(st *state) {
	model := vramguard.NormalizeModelName(st.model)
	g.mu.Lock()
	g.loaded[model] = st.client
	g.mu.Unlock()
	g.metrics.loads.WithLabelValues(g.metrics.label(st.client), model, st.cause).Inc()
	g.log.Info("load", "model", model, "client", st.client, "cause", st.cause, "by", st.by)
}

// jsonProblem says what is wrong with a body, without Go's type names.
func jsonProblem(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field != "" {
			return "field " + te.Field + " cannot be a JSON " + te.Value
		}
		return "want a JSON object, got a JSON " + te.Value
	}
	return err.Error()
}
