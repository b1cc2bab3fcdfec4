package vramguardtest

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ollama/ollama/api"
	omodel "github.com/ollama/ollama/types/model"
)

// maxBody bounds request bodies.
const maxBody = 32 << 20

// routes returns the server's HTTP handler.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /api/generate", s.handleGenerate)
	mux.HandleFunc("POST /api/chat", s.handleChat)
	mux.HandleFunc("GET /api/ps", s.handlePS)
	mux.HandleFunc("GET /api/tags", s.handleTags)
	mux.HandleFunc("POST /api/show", s.handleShow)
	mux.HandleFunc("GET /api/version", s.handleVersion)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "Ollama is running")
	})
	return mux
}

// call is a generate or chat request being served.
type call struct {
	Call          // as received
	prompt string // generate's prompt, or the content of chat's last message
	empty  bool   // no prompt (generate) or no messages (chat)
	stream bool
}

func (c *call) chat() bool { return c.Endpoint == "chat" }

// frame builds one reply object of the call's endpoint. Tool calls go into
// a chat message and are dropped by generate.
func (c *call) frame(ch Chunk, done bool, reason string, met api.Metrics) any {
	now := time.Now().UTC()
	if c.chat() {
		return api.ChatResponse{
			Model:      c.Model,
			CreatedAt:  now,
			Message:    api.Message{Role: "assistant", Content: ch.Text, Thinking: ch.Thinking, ToolCalls: ch.ToolCalls},
			Done:       done,
			DoneReason: reason,
			Metrics:    met,
		}
	}
	return api.GenerateResponse{
		Model:      c.Model,
		CreatedAt:  now,
		Response:   ch.Text,
		Thinking:   ch.Thinking,
		Done:       done,
		DoneReason: reason,
		Metrics:    met,
	}
}

func (s *Server) handleGenerate(w http.ResponseWriter, r *http.Request) {
	var req api.GenerateRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.serve(w, r, &call{
		Call: Call{
			Endpoint:  "generate",
			Model:     req.Model,
			Prompt:    req.Prompt,
			System:    req.System,
			Images:    req.Images,
			Format:    req.Format,
			Think:     req.Think,
			Options:   req.Options,
			KeepAlive: req.KeepAlive,
			Stream:    req.Stream,
		},
		prompt: req.Prompt,
		empty:  req.Prompt == "",
		stream: req.Stream == nil || *req.Stream,
	})
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	var req api.ChatRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if _, _, ok := modelName(req.Model); !ok {
		writeError(w, http.StatusBadRequest, "model is required")
		return
	}
	var prompt string
	if n := len(req.Messages); n > 0 {
		prompt = req.Messages[n-1].Content
	}
	s.serve(w, r, &call{
		Call: Call{
			Endpoint:  "chat",
			Model:     req.Model,
			Messages:  req.Messages,
			Tools:     req.Tools,
			Format:    req.Format,
			Think:     req.Think,
			Options:   req.Options,
			KeepAlive: req.KeepAlive,
			Stream:    req.Stream,
		},
		prompt: prompt,
		empty:  len(req.Messages) == 0,
		stream: req.Stream == nil || *req.Stream,
	})
}

// serve runs a generate or chat call through the simulated scheduler.
func (s *Server) serve(w http.ResponseWriter, r *http.Request, c *call) {
	ctx := r.Context()
	start := time.Now()

	s.mu.Lock()
	m, err := s.lookupLocked(c.Model)
	if err != nil {
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, fmt.Sprintf("model '%s' not found", c.Model))
		return
	}
	m.stats.Requests++
	s.notifyLocked()
	if c.empty && c.KeepAlive != nil && c.KeepAlive.Duration == 0 {
		s.eventLocked(m, EventUnloadRequest, &c.Call)
		s.expireLocked(m)
		s.mu.Unlock()
		writeJSON(w, http.StatusOK, c.frame(Chunk{}, true, "unload", api.Metrics{}))
		return
	}
	s.recordLocked(m, c.Call)
	s.eventLocked(m, EventRequest, &c.Call)
	// Capabilities are checked before scheduling, as Ollama's handlers and
	// scheduleRunner do.
	if c.Think != nil && c.Think.Bool() && !m.cfg.Thinking {
		s.mu.Unlock()
		writeError(w, http.StatusBadRequest, fmt.Sprintf("%q does not support thinking", c.Model))
		return
	}
	if len(c.Tools) > 0 && !m.cfg.Tools {
		s.mu.Unlock()
		writeError(w, http.StatusBadRequest, m.name+" does not support tools")
		return
	}
	fs := s.takeFaultsLocked(m)
	cfg := m.cfg
	s.mu.Unlock()

	if fs.has(FaultBusy) {
		writeError(w, http.StatusServiceUnavailable, msgBusy)
		return
	}
	var keepAlive *time.Duration
	if c.KeepAlive != nil {
		keepAlive = &c.KeepAlive.Duration
	}
	rn, loadDur, err := s.acquire(ctx, start, m, keepAlive, optInt(c.Options, "num_ctx"), fs)
	if err != nil {
		if ctx.Err() != nil {
			s.countCancel(m)
			writeError(w, 499, msgCanceled)
			return
		}
		var se *statusError
		if errors.As(err, &se) {
			writeError(w, se.code, se.msg)
		} else {
			writeError(w, http.StatusInternalServerError, err.Error())
		}
		return
	}
	defer s.release(rn, true)

	if c.empty {
		writeJSON(w, http.StatusOK, c.frame(Chunk{}, true, "load", api.Metrics{}))
		return
	}
	// The format and the images are refused only by the loaded runner, as
	// in Ollama: the model stays loaded.
	schema, err := parseFormat(c.Format)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	if c.ImageCount() > 0 && !cfg.Vision {
		writeError(w, http.StatusInternalServerError, msgNoVision)
		return
	}
	s.generate(ctx, w, c, rn, cfg, schema, fs, start, loadDur)
}

// generate streams the reply of a call holding runner rn. schema is the
// request's parsed format (see parseFormat).
func (s *Server) generate(ctx context.Context, w http.ResponseWriter, c *call, rn *runner, cfg ModelConfig, schema any, fs faults, start time.Time, loadDur time.Duration) {
	var chunks []Chunk
	switch {
	case cfg.RespondTo != nil:
		chunks = cfg.RespondTo(c.Call)
	case cfg.Respond != nil:
		chunks = cfg.Respond(c.prompt)
	case schema != nil:
		chunks = jsonResponse(c.prompt, schema, cfg.Chunks, cfg.Thinking)
	default:
		chunks = defaultResponse(c.prompt, cfg.Chunks, cfg.Thinking)
	}
	if !cfg.Thinking || (c.Think != nil && !c.Think.Bool()) {
		chunks = withoutThinking(chunks)
	}
	reason := "stop"
	if n := numPredict(c.Options); n > 0 && n < len(chunks) {
		chunks, reason = chunks[:n], "length"
	}
	if fs.repeat() {
		chunks = slices.Repeat([]Chunk{{Text: " la"}}, len(chunks))
	}

	out := &replier{w: w, rc: http.NewResponseController(w), c: c, ids: &s.toolCallIDs}
	// stop reports a cut-short generation; a gone client counts as cancelled.
	stop := func(err error) {
		if ctx.Err() != nil || !errors.Is(err, errClosed) {
			s.countCancel(rn.m)
		}
	}
	genStart := time.Now()
	if err := s.sleep(ctx, fs.stallBefore()); err != nil {
		stop(err)
		return
	}
	for i := 0; ; i++ {
		for _, f := range fs {
			if f.After != i && (i < len(chunks) || f.After < i) {
				continue
			}
			switch f.Kind {
			case FaultStallAfter:
				if err := s.sleep(ctx, f.Delay); err != nil {
					stop(err)
					return
				}
			case FaultCrash:
				s.crash(rn)
				out.fail(msgCrash)
				return
			case FaultClose, FaultRepeat:
				out.cut()
				return
			}
		}
		if i == len(chunks) {
			break
		}
		if err := s.sleep(ctx, cfg.TokenLatency); err != nil {
			stop(err)
			return
		}
		if err := out.chunk(chunks[i]); err != nil {
			stop(err)
			return
		}
	}
	promptCount := max(len(strings.Fields(c.prompt)), 1)
	met := api.Metrics{
		TotalDuration:      time.Since(start),
		LoadDuration:       loadDur,
		PromptEvalCount:    promptCount,
		PromptEvalDuration: time.Duration(promptCount) * time.Microsecond,
		EvalCount:          len(chunks),
		EvalDuration:       max(time.Since(genStart), time.Nanosecond),
	}
	if err := out.done(reason, met); err != nil {
		stop(err)
		return
	}
	s.mu.Lock()
	rn.m.stats.Completed++
	s.notifyLocked()
	s.mu.Unlock()
}

func (s *Server) countCancel(m *model) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m.stats.Cancelled++
	s.notifyLocked()
}

// sleep waits for d, or until ctx is done or the server closes.
func (s *Server) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-s.done:
		return errClosed
	}
}

// replier writes a call's reply: NDJSON lines flushed one by one when
// streaming, one JSON object otherwise. Like Ollama it sends no header
// before the first line.
type replier struct {
	w              http.ResponseWriter
	rc             *http.ResponseController
	c              *call
	ids            *atomic.Uint64 // numbers tool calls that come without an ID
	wrote          bool
	text, thinking strings.Builder // accumulated when not streaming
	toolCalls      []api.ToolCall  // accumulated when not streaming
}

func (o *replier) chunk(ch Chunk) error {
	ch.ToolCalls = o.withIDs(ch.ToolCalls)
	if !o.c.stream {
		o.text.WriteString(ch.Text)
		o.thinking.WriteString(ch.Thinking)
		o.toolCalls = append(o.toolCalls, ch.ToolCalls...)
		return nil
	}
	return o.line(o.c.frame(ch, false, "", api.Metrics{}))
}

// withIDs returns tcs with an ID for each call that has none, as Ollama's
// chat handler gives each parsed tool call ("call_" and 8 characters). It
// does not modify tcs, which may belong to the test.
func (o *replier) withIDs(tcs []api.ToolCall) []api.ToolCall {
	if len(tcs) == 0 {
		return nil
	}
	tcs = slices.Clone(tcs)
	for i := range tcs {
		if tcs[i].ID == "" {
			tcs[i].ID = fmt.Sprintf("call_%08d", o.ids.Add(1))
		}
	}
	return tcs
}

func (o *replier) line(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if !o.wrote {
		o.w.Header().Set("Content-Type", "application/x-ndjson")
		o.wrote = true
	}
	if _, err := o.w.Write(append(b, '\n')); err != nil {
		return err
	}
	return o.rc.Flush()
}

// whole is the single reply object when not streaming.
func (o *replier) whole(done bool, reason string, met api.Metrics) any {
	ch := Chunk{Text: o.text.String(), Thinking: o.thinking.String(), ToolCalls: o.toolCalls}
	return o.c.frame(ch, done, reason, met)
}

// done sends the final done:true object.
func (o *replier) done(reason string, met api.Metrics) error {
	if !o.c.stream {
		writeJSON(o.w, http.StatusOK, o.whole(true, reason, met))
		return nil
	}
	return o.line(o.c.frame(Chunk{}, true, reason, met))
}

// fail ends the reply with an error: a status reply if nothing was sent,
// else an error line.
func (o *replier) fail(msg string) {
	if o.wrote {
		o.line(map[string]string{"error": msg})
		return
	}
	writeError(o.w, http.StatusInternalServerError, msg)
}

// cut ends the reply without done:true. Not streaming, Ollama then sends
// what it has with done false.
func (o *replier) cut() {
	if !o.c.stream {
		writeJSON(o.w, http.StatusOK, o.whole(false, "", api.Metrics{}))
	}
}

func (s *Server) handlePS(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	d := s.psDelay
	s.mu.Unlock()
	if err := s.sleep(r.Context(), d); err != nil {
		return
	}

	s.mu.Lock()
	now := time.Now()
	models := []api.ProcessModelResponse{}
	for _, m := range s.order {
		rn := m.runner
		if rn == nil || rn.loading {
			continue
		}
		models = append(models, api.ProcessModelResponse{
			Name:          m.short,
			Model:         m.short,
			Size:          int64(m.cfg.Size),
			SizeVRAM:      int64(rn.vram),
			Digest:        m.cfg.Digest,
			Details:       m.cfg.Details,
			ExpiresAt:     rn.expiresAtFor(now),
			ContextLength: m.cfg.ContextLength,
		})
	}
	s.mu.Unlock()
	slices.SortStableFunc(models, func(a, b api.ProcessModelResponse) int {
		return cmp.Compare(b.ExpiresAt.Unix(), a.ExpiresAt.Unix()) // longest remaining first
	})
	writeJSON(w, http.StatusOK, api.ProcessResponse{Models: models})
}

func (s *Server) handleTags(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	models := []api.ListModelResponse{}
	for _, m := range s.order {
		models = append(models, api.ListModelResponse{
			Name:       m.short,
			Model:      m.short,
			ModifiedAt: m.added,
			Size:       int64(m.cfg.Size),
			Digest:     m.cfg.Digest,
			Details:    m.cfg.Details,
		})
	}
	s.mu.Unlock()
	slices.SortStableFunc(models, func(a, b api.ListModelResponse) int {
		return b.ModifiedAt.Compare(a.ModifiedAt) // newest first
	})
	writeJSON(w, http.StatusOK, api.ListResponse{Models: models})
}

func (s *Server) handleShow(w http.ResponseWriter, r *http.Request) {
	var req api.ShowRequest
	if err := decodeBody(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	//lint:ignore SA1019 Ollama's handler still accepts the deprecated field
	name := cmp.Or(req.Model, req.Name)
	if name == "" {
		writeError(w, http.StatusBadRequest, "model is required")
		return
	}
	s.mu.Lock()
	m, err := s.lookupLocked(name)
	var cfg ModelConfig
	var added time.Time
	var short string
	if err == nil {
		cfg, added, short = m.cfg, m.added, m.short
	}
	s.mu.Unlock()
	if err != nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("model '%s' not found", name))
		return
	}
	// In the order of Ollama's Model.Capabilities.
	caps := []omodel.Capability{omodel.CapabilityCompletion}
	if cfg.Tools {
		caps = append(caps, omodel.CapabilityTools)
	}
	if cfg.Vision {
		caps = append(caps, omodel.CapabilityVision)
	}
	if cfg.Thinking {
		caps = append(caps, omodel.CapabilityThinking)
	}
	writeJSON(w, http.StatusOK, api.ShowResponse{
		Modelfile:    modelfile(short, cfg),
		Template:     "{{ .Prompt }}",
		Details:      cfg.Details,
		ModelInfo:    modelInfo(cfg),
		Capabilities: caps,
		ModifiedAt:   added,
	})
}

// modelfile writes a modelfile the way Ollama's /api/show does: comments,
// then the FROM line naming the weights blob's path.
func modelfile(short string, cfg ModelConfig) string {
	blob := strings.Replace(cfg.Blob, ":", "-", 1)
	return "# Modelfile generated by \"ollama show\"\n" +
		"# To build a new Modelfile based on this, replace FROM with:\n" +
		"# FROM " + short + "\n\n" +
		"FROM " + ModelsDir + "/blobs/" + blob + "\n" +
		"TEMPLATE {{ .Prompt }}\n"
}

func (s *Server) handleVersion(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": s.cfg.Version})
}

// decodeBody reads a JSON request body like Ollama's handlers: an empty
// body is "missing request body", a bad field is the decoder's error (for
// keep_alive "300": time: missing unit in duration "300").
func decodeBody(r *http.Request, v any) error {
	b, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, maxBody))
	if err != nil {
		return err
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return errors.New("missing request body")
	}
	return json.Unmarshal(b, v)
}

// writeJSON writes v as the whole reply.
func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code = http.StatusInternalServerError
		b = []byte(`{"error":"internal error"}`)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(code)
	w.Write(b)
}

// writeError writes Ollama's error reply {"error": msg}.
func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}

// numPredict returns the num_predict option, or 0.
func numPredict(opts map[string]any) int { return optInt(opts, "num_predict") }

// optInt is an integer request option (JSON numbers arrive as float64);
// 0 when absent.
func optInt(opts map[string]any, key string) int {
	switch v := opts[key].(type) {
	case float64:
		return int(v)
	case int:
		return v
	}
	return 0
}

// withoutThinking drops the thinking part of chunks, and chunks left empty.
func withoutThinking(chunks []Chunk) []Chunk {
	out := make([]Chunk, 0, len(chunks))
	for _, ch := range chunks {
		if ch.Text != "" || len(ch.ToolCalls) > 0 {
			out = append(out, Chunk{Text: ch.Text, ToolCalls: ch.ToolCalls})
		}
	}
	return out
}
