package standin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"time"
)

// maxBody bounds a request body; llama-server has no such limit, but the
// stand-in only ever sees small test prompts.
const maxBody = 64 << 20

// handler routes the endpoints Ollama v0.34.4 calls (llm/llama_server.go):
// /health, /completion, /v1/chat/completions, /tokenize, /detokenize,
// /apply-template and /v1/embeddings; /props is there for completeness.
// Every request is logged, and everything but /health answers 503 while
// the model loads, as in llama-server.
func (r *runner) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", r.health)
	mux.HandleFunc("GET /v1/health", r.health)
	mux.HandleFunc("POST /completion", r.completion)
	mux.HandleFunc("POST /completions", r.completion)
	mux.HandleFunc("POST /v1/chat/completions", r.chat)
	mux.HandleFunc("POST /chat/completions", r.chat)
	mux.HandleFunc("POST /tokenize", r.tokenize)
	mux.HandleFunc("POST /detokenize", r.detokenize)
	mux.HandleFunc("POST /apply-template", r.applyTemplate)
	mux.HandleFunc("POST /v1/embeddings", r.embeddings)
	mux.HandleFunc("POST /embeddings", r.embeddings)
	mux.HandleFunc("GET /props", r.props)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, apiError{Code: http.StatusNotFound, Message: "File Not Found", Type: "not_found_error"})
	})

	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !r.enter() {
			panic(http.ErrAbortHandler) // shutting down: drop the connection
		}
		defer r.handlers.Done()

		body, err := io.ReadAll(io.LimitReader(req.Body, maxBody))
		r.events.request(req.Method, req.URL.Path, body)
		if err != nil {
			return
		}
		req.Body = io.NopCloser(bytes.NewReader(body))

		if p := req.URL.Path; p != "/health" && p != "/v1/health" {
			switch st, msg := r.loadState(); st {
			case stateLoading:
				writeError(w, errLoading)
				return
			case stateFailed:
				writeError(w, apiError{Code: http.StatusInternalServerError, Message: msg, Type: "server_error"})
				return
			}
		}
		mux.ServeHTTP(w, req)
	})
}

// enter registers a handler with the join point unless the process is
// shutting down.
func (r *runner) enter() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closing {
		return false
	}
	r.handlers.Add(1)
	return true
}

// apiError is llama-server's error body: {"error":{"code":..,"message":..,"type":..}}.
type apiError struct {
	Code          int    `json:"code"`
	Message       string `json:"message"`
	Type          string `json:"type"`
	NPromptTokens int    `json:"n_prompt_tokens,omitempty"`
	NCtx          int    `json:"n_ctx,omitempty"`
}

var errLoading = apiError{Code: http.StatusServiceUnavailable, Message: "Loading model", Type: "unavailable_error"}

func badRequest(msg string) *apiError {
	return &apiError{Code: http.StatusBadRequest, Message: msg, Type: "invalid_request_error"}
}

func writeError(w http.ResponseWriter, e apiError) {
	writeJSON(w, e.Code, struct {
		Error apiError `json:"error"`
	}{e})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		status = http.StatusInternalServerError
		buf.Reset()
		fmt.Fprintf(&buf, `{"error":{"code":500,"message":%q,"type":"server_error"}}`, err.Error())
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// writeEvent writes one server-sent event and flushes it.
func writeEvent(w http.ResponseWriter, v any) error {
	var data []byte
	if s, ok := v.(string); ok {
		data = []byte(s)
	} else {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			return err
		}
		data = bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
	}
	if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
		return err
	}
	return http.NewResponseController(w).Flush()
}

func decodeBody(req *http.Request, v any) *apiError {
	b, _ := io.ReadAll(req.Body)
	if len(bytes.TrimSpace(b)) == 0 {
		b = []byte("{}")
	}
	if err := json.Unmarshal(b, v); err != nil {
		return badRequest(fmt.Sprintf("invalid JSON body: %v", err))
	}
	return nil
}

func (r *runner) health(w http.ResponseWriter, _ *http.Request) {
	switch st, msg := r.loadState(); st {
	case stateReady:
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	case stateLoading:
		writeError(w, errLoading)
	default:
		writeError(w, apiError{Code: http.StatusInternalServerError, Message: msg, Type: "server_error"})
	}
}

// hang holds a request without answering until its client goes away or
// the process shuts down.
func (r *runner) hang(ctx context.Context) {
	task := r.tasks.Add(1)
	r.log.linef("srv  params_from_: hang=completion: holding task %d without an answer", task)
	select {
	case <-ctx.Done():
	case <-r.stop:
	}
	r.log.linef("srv  cancel_tasks: cancel task, id_task = %d", task)
}

func (r *runner) modelAlias() string {
	if r.opts.alias != "" {
		return r.opts.alias
	}
	if r.opts.model != "" {
		return filepath.Base(r.opts.model)
	}
	return "standin"
}

type completionRequest struct {
	Prompt         json.RawMessage `json:"prompt"`
	Stream         bool            `json:"stream"`
	NPredict       *int            `json:"n_predict"`
	MaxTokens      *int            `json:"max_tokens"`
	Seed           *int64          `json:"seed"`
	Stop           []string        `json:"stop"`
	Grammar        string          `json:"grammar"`
	JSONSchema     json.RawMessage `json:"json_schema"`
	ResponseFields []string        `json:"response_fields"`
}

// schemaGrammar stands in for the GBNF llama-server derives from a JSON
// schema, reported in a completion's generation_settings. Ollama asks for
// it (with an empty prompt) to wrap a schema into a grammar of its own for
// thinking models, and passes that grammar back, which the stand-in does
// not interpret.
const schemaGrammar = `root ::= "{" space "}" space
space ::= | " " | "\n" [ \t]{0,20}
`

// begin plans a completion or chat generation, or answers the request
// itself: with an error (the prompt does not fit), or by hanging until the
// client goes away (Hang "completion"). ok is false when it answered. A
// non-nil schema makes the answer its minimal instance (schemaPieces).
func (r *runner) begin(w http.ResponseWriter, req *http.Request, k Knobs, prompt []int, nPredict int, seed int64, stops []string, schema json.RawMessage) (p plan, ok bool) {
	p, e := r.plan(k, prompt, nPredict, seed, stops, r.structured(schema, prompt, seed))
	if e != nil {
		writeError(w, *e)
		return p, false
	}
	if k.Hang == HangCompletion {
		r.hang(req.Context())
		return p, false
	}
	return p, true
}

// structured returns the tokens of the answer schema asks for, or nil for
// free text: no schema, or one the stand-in does not follow (it says so on
// stderr).
func (r *runner) structured(schema json.RawMessage, prompt []int, seed int64) []string {
	if isNull(schema) {
		return nil
	}
	pieces, err := schemaPieces(schema, newSampler(prompt, seed))
	if err != nil {
		r.log.linef("srv  params_from_: vramguard stand-in: json schema not followed, answering with free text: %v", err)
		return nil
	}
	return pieces
}

// seedOf is a request's seed, or the default when it sends none.
func seedOf(p *int64) int64 {
	if p == nil {
		return defaultSeed
	}
	return *p
}

func (r *runner) completion(w http.ResponseWriter, req *http.Request) {
	k := r.knobs.current()
	var body completionRequest
	if e := decodeBody(req, &body); e != nil {
		writeError(w, *e)
		return
	}
	prompt, err := promptTokens(body.Prompt)
	if errors.Is(err, errMultimodalPrompt) {
		writeError(w, *badRequest(msgMultimodalPrompt))
		return
	}
	if err != nil {
		writeError(w, *badRequest(err.Error()))
		return
	}
	nPredict, seed := firstSet(-1, body.NPredict, body.MaxTokens), seedOf(body.Seed)
	p, ok := r.begin(w, req, k, prompt, nPredict, seed, body.Stop, body.JSONSchema)
	if !ok {
		return
	}

	grammar := body.Grammar
	if grammar == "" && !isNull(body.JSONSchema) {
		grammar = schemaGrammar
	}
	alias := r.modelAlias()
	final := func(g generation, content string, tokens []int) map[string]any {
		return map[string]any{
			"index":            0,
			"content":          content,
			"tokens":           tokens,
			"id_slot":          0,
			"stop":             true,
			"model":            alias,
			"tokens_predicted": g.n,
			"tokens_evaluated": len(prompt),
			"generation_settings": map[string]any{
				"n_predict": nPredict,
				"seed":      seed,
				"stop":      nonNil(body.Stop),
				"grammar":   grammar,
			},
			"prompt":        detokenize(prompt),
			"has_new_line":  strings.Contains(g.text, "\n"),
			"truncated":     false,
			"stop_type":     g.stopType,
			"stopping_word": g.stoppingWord,
			"tokens_cached": len(prompt) + g.n,
			"timings":       g.timings(len(prompt)),
		}
	}

	ctx := req.Context()
	if !body.Stream {
		g, err := r.generate(ctx, k, p, func(string) error { return nil })
		if err != nil {
			return
		}
		res := final(g, g.text, nonNil(tokenize(g.text, false)))
		if len(body.ResponseFields) > 0 {
			res = selectFields(res, body.ResponseFields)
		}
		writeJSON(w, http.StatusOK, res)
		return
	}

	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	n := 0
	g, err := r.generate(ctx, k, p, func(piece string) error {
		n++
		return writeEvent(w, map[string]any{
			"index":            0,
			"content":          piece,
			"tokens":           tokenize(piece, false),
			"stop":             false,
			"id_slot":          -1,
			"tokens_predicted": n,
			"tokens_evaluated": len(prompt),
		})
	})
	if err != nil {
		return // the client went away
	}
	_ = writeEvent(w, final(g, "", []int{}))
}

// defaultSeed is llama.cpp's LLAMA_DEFAULT_SEED.
const defaultSeed = 0xFFFFFFFF

func firstSet(def int, vals ...*int) int {
	for _, v := range vals {
		if v != nil {
			return *v
		}
	}
	return def
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// selectFields implements llama-server's response_fields: each entry is a
// "/"-separated path into the response, returned under the path itself.
func selectFields(res map[string]any, fields []string) map[string]any {
	out := make(map[string]any, len(fields))
	for _, f := range fields {
		var v any = res
		ok := true
		for _, part := range strings.Split(f, "/") {
			m, isMap := v.(map[string]any)
			if !isMap {
				ok = false
				break
			}
			if v, ok = m[part]; !ok {
				break
			}
		}
		if ok {
			out[f] = v
		}
	}
	return out
}

type chatRequest struct {
	Messages            []chatMessage   `json:"messages"`
	Stream              bool            `json:"stream"`
	NPredict            *int            `json:"n_predict"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	MaxTokens           *int            `json:"max_tokens"`
	Seed                *int64          `json:"seed"`
	Stop                json.RawMessage `json:"stop"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
	ResponseFormat      json.RawMessage `json:"response_format"`
	JSONSchema          json.RawMessage `json:"json_schema"`
}

func (c chatRequest) stops() []string {
	var one string
	if json.Unmarshal(c.Stop, &one) == nil && one != "" {
		return []string{one}
	}
	var many []string
	_ = json.Unmarshal(c.Stop, &many)
	return many
}

func (c chatRequest) prompt() string {
	gen := c.AddGenerationPrompt == nil || *c.AddGenerationPrompt
	return applyTemplate(c.Messages, gen)
}

func (r *runner) chat(w http.ResponseWriter, req *http.Request) {
	k := r.knobs.current()
	var body chatRequest
	if e := decodeBody(req, &body); e != nil {
		writeError(w, *e)
		return
	}
	if len(body.Messages) == 0 {
		writeError(w, *badRequest("'messages' is required and must be a non-empty array"))
		return
	}
	if e := mediaUnsupported(body.Messages); e != nil {
		writeError(w, *e)
		return
	}
	schema, e := chatSchema(body)
	if e != nil {
		writeError(w, *e)
		return
	}
	prompt := tokenize(body.prompt(), true)
	p, ok := r.begin(w, req, k, prompt, firstSet(-1, body.NPredict, body.MaxCompletionTokens, body.MaxTokens), seedOf(body.Seed), body.stops(), schema)
	if !ok {
		return
	}

	alias := r.modelAlias()
	id := fmt.Sprintf("chatcmpl-standin-%d", r.chats.Add(1))
	created := time.Now().Unix()
	envelope := func(object string, choices []map[string]any) map[string]any {
		return map[string]any{
			"choices":            choices,
			"created":            created,
			"id":                 id,
			"model":              alias,
			"system_fingerprint": "b" + Build + "-vramguard-standin",
			"object":             object,
		}
	}
	usage := func(g generation) map[string]int {
		return map[string]int{"completion_tokens": g.n, "prompt_tokens": len(prompt), "total_tokens": g.n + len(prompt)}
	}

	ctx := req.Context()
	if !body.Stream {
		g, err := r.generate(ctx, k, p, func(string) error { return nil })
		if err != nil {
			return
		}
		res := envelope("chat.completion", []map[string]any{{
			"finish_reason": g.finishReason(),
			"index":         0,
			"message":       map[string]any{"role": "assistant", "content": g.text},
		}})
		res["usage"] = usage(g)
		res["timings"] = g.timings(len(prompt))
		writeJSON(w, http.StatusOK, res)
		return
	}

	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	if err := writeEvent(w, envelope("chat.completion.chunk", []map[string]any{{
		"finish_reason": nil,
		"index":         0,
		"delta":         map[string]any{"role": "assistant", "content": nil},
	}})); err != nil {
		return
	}
	g, err := r.generate(ctx, k, p, func(piece string) error {
		return writeEvent(w, envelope("chat.completion.chunk", []map[string]any{{
			"finish_reason": nil,
			"index":         0,
			"delta":         map[string]any{"content": piece},
		}}))
	})
	if err != nil {
		return
	}
	last := envelope("chat.completion.chunk", []map[string]any{{
		"finish_reason": g.finishReason(),
		"index":         0,
		"delta":         map[string]any{},
	}})
	last["usage"] = usage(g)
	last["timings"] = g.timings(len(prompt))
	if writeEvent(w, last) == nil {
		_ = writeEvent(w, "[DONE]")
	}
}

func (r *runner) tokenize(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Content    json.RawMessage `json:"content"`
		AddSpecial bool            `json:"add_special"`
		WithPieces bool            `json:"with_pieces"`
	}
	if e := decodeBody(req, &body); e != nil {
		writeError(w, *e)
		return
	}
	var ids []int
	var s string
	switch {
	case len(body.Content) == 0 || string(body.Content) == "null":
		writeError(w, *badRequest(`"content" must be provided`))
		return
	case json.Unmarshal(body.Content, &s) == nil:
		ids = tokenize(s, body.AddSpecial)
	default:
		var err error
		if ids, err = promptTokens(body.Content); err != nil {
			writeError(w, *badRequest(err.Error()))
			return
		}
		if body.AddSpecial && (len(ids) == 0 || ids[0] != tokenBOS) {
			ids = append([]int{tokenBOS}, ids...)
		}
	}
	ids = nonNil(ids)
	if !body.WithPieces {
		writeJSON(w, http.StatusOK, map[string]any{"tokens": ids})
		return
	}
	pieces := make([]map[string]any, len(ids))
	for i, id := range ids {
		pieces[i] = map[string]any{"id": id, "piece": piece(id)}
	}
	writeJSON(w, http.StatusOK, map[string]any{"tokens": pieces})
}

func (r *runner) detokenize(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Tokens []int `json:"tokens"`
	}
	if e := decodeBody(req, &body); e != nil {
		writeError(w, *e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"content": detokenize(body.Tokens)})
}

func (r *runner) applyTemplate(w http.ResponseWriter, req *http.Request) {
	var body chatRequest
	if e := decodeBody(req, &body); e != nil {
		writeError(w, *e)
		return
	}
	if e := mediaUnsupported(body.Messages); e != nil {
		writeError(w, *e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"prompt": body.prompt()})
}

// embeddingSize is the length of the stand-in's embeddings.
const embeddingSize = 32

func (r *runner) embeddings(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Input   json.RawMessage `json:"input"`
		Content json.RawMessage `json:"content"`
	}
	if e := decodeBody(req, &body); e != nil {
		writeError(w, *e)
		return
	}
	raw := body.Input
	if len(raw) == 0 {
		raw = body.Content
	}
	var inputs [][]int
	var one string
	var many []string
	switch {
	case json.Unmarshal(raw, &one) == nil:
		inputs = append(inputs, tokenize(one, true))
	case json.Unmarshal(raw, &many) == nil:
		for _, s := range many {
			inputs = append(inputs, tokenize(s, true))
		}
	default:
		ids, err := promptTokens(raw)
		if err != nil {
			writeError(w, *badRequest(`"input" must be a string, an array of strings or an array of tokens`))
			return
		}
		inputs = append(inputs, ids)
	}
	nctx := r.opts.slotCtx()
	data := make([]map[string]any, len(inputs))
	total := 0
	for i, ids := range inputs {
		if len(ids) > nctx {
			writeError(w, exceedContext(len(ids), nctx))
			return
		}
		total += len(ids)
		s := newSampler(ids, 0)
		vec := make([]float64, embeddingSize)
		var norm float64
		for j := range vec {
			vec[j] = float64(s.draw()%2001)/1000 - 1
			norm += vec[j] * vec[j]
		}
		if norm > 0 {
			for j := range vec {
				vec[j] /= math.Sqrt(norm)
			}
		}
		data[i] = map[string]any{"embedding": vec, "index": i, "object": "embedding"}
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"model":  r.modelAlias(),
		"object": "list",
		"usage":  map[string]int{"prompt_tokens": total, "total_tokens": total},
		"data":   data,
	})
}

func (r *runner) props(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"default_generation_settings": map[string]any{"n_ctx": r.opts.slotCtx()},
		"total_slots":                 r.opts.slots(),
		"model_alias":                 r.modelAlias(),
		"model_path":                  r.opts.model,
		"chat_template":               chatTemplate,
		"modalities":                  map[string]bool{"vision": false, "audio": false},
		"build_info":                  "b" + Build + "-vramguard-standin",
	})
}
