package vramguard

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/internal/wire"
)

// MaxPromptBytes is the largest prompt (plus system prompt) accepted.
const MaxPromptBytes = 16 << 20

// OllamaClient talks to one Ollama server. It streams generations with
// timeouts that cancel the server-side request, classifies every failure,
// and unloads models verifiably.
//
// It is safe for concurrent use. Create it with NewClient and end it with
// Close, which joins the cleanups started by CleanupAsync.
type OllamaClient struct {
	api  *api.Client
	host string // for the CLI fallback; "" when unknown
	// base and hc are set when the client built its own api.Client: unload
	// requests then go out as plain POSTs (the api client allocates an
	// 8 MiB line buffer per call).
	base *url.URL
	hc   *http.Client
	opts Options
	log  *slog.Logger
	// procRoot is the procfs root UnloadModel reads runners from; "" is
	// /proc (tests point it at a fake tree).
	procRoot string

	book      *book      // models in flight, in use, warm; phases; closed (book.go)
	tasks     tasks      // background work and its joining (tasks.go)
	tenants   tenants    // what gives memory back: room-making's and ReleaseVRAM's (tenant.go)
	ps        *poller    // the /api/ps requests unloads share (poller.go)
	admission admission  // Options.Budget's checks (admission.go)
	churn     churn      // why models loaded again (churn.go)
	leases    leases     // the host's lease directory and the leases this client holds (lease.go)
	closing   closeState // Close and Shutdown (client.go)
}

// NewClient validates opts and returns a client. It does not contact the
// server.
func NewClient(opts Options) (*OllamaClient, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	opts.setDefaults()
	c := &OllamaClient{
		opts: opts,
		log:  opts.Logger,
		book: newBook(),
	}
	if opts.Budget != nil && opts.VRAM == nil {
		c.budgetOff("no VRAM reader") // Budget.OffWithoutGPU, or validate refused it
	}
	host := opts.Host
	if host == "" && opts.API == nil {
		getenv := opts.Getenv
		if getenv == nil {
			getenv = os.Getenv
		}
		host = getenv("OLLAMA_HOST")
	}
	if opts.API != nil {
		c.api = opts.API
		if host != "" {
			u, err := parseHost(host)
			if err != nil {
				return nil, err
			}
			c.host = u.String()
		}
		c.ps = newPoller(c.api, opts, c.churn.listed)
		return c, nil
	}
	if host == "" {
		host = defaultHost
	}
	u, err := parseHost(host)
	if err != nil {
		return nil, err
	}
	hc := opts.HTTPClient
	if hc == nil {
		hc = &http.Client{}
	}
	c.host = u.String()
	c.base, c.hc = u, hc
	c.api = api.NewClient(u, hc)
	c.ps = newPoller(c.api, opts, c.churn.listed)
	return c, nil
}

// parseHost accepts what OLLAMA_HOST accepts: a URL with scheme, or
// host[:port] (http, port 11434 by default), with an optional path prefix.
func parseHost(s string) (*url.URL, error) {
	const op = "new client"
	raw := strings.TrimSpace(s)
	if raw == "" || strings.ContainsAny(raw, " \t\r\n") {
		return nil, invalid(op, "", "host %q is not a URL or host:port", s)
	}
	if !strings.Contains(raw, "://") {
		raw = "http://" + raw
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, newError(op, "", KindInvalidInput, fmt.Errorf("host %q: %w", s, err))
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, invalid(op, "", "host %q: scheme must be http or https", s)
	}
	if u.Hostname() == "" {
		return nil, invalid(op, "", "host %q has no host name", s)
	}
	if u.Port() == "" {
		port := "11434"
		if u.Scheme == "https" && strings.Contains(s, "://") {
			port = "443"
		}
		u.Host = joinHostPort(u.Hostname(), port)
	}
	u.RawQuery, u.Fragment = "", ""
	return u, nil
}

func joinHostPort(host, port string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]:" + port
	}
	return host + ":" + port
}

// API returns the underlying Ollama API client, for calls this package does
// not wrap.
func (c *OllamaClient) API() *api.Client { return c.api }

// Host returns the client's server as a URL ("http://127.0.0.1:11434"),
// as hooks report it (CallStart.Server) and leases name it; "" for a
// client made with a caller's api.Client and no Options.Host. A pool's
// client (package pool) returns the pool's own address, pool.Host.
func (c *OllamaClient) Host() string { return c.host }

// GenerateRequest is one generation. Model and Prompt are required.
type GenerateRequest struct {
	Model  string
	Prompt string
	System string
	// Options are Ollama's model options: temperature, top_p, seed,
	// num_predict, ... Validated values only: see the nodes package for
	// typed sampling settings.
	Options map[string]any
	// Think asks a thinking model to think (true) or not (false); nil
	// leaves the model's default.
	Think *bool
	// Images go to a vision model with the prompt: PNG, JPEG or WebP
	// (told by their bytes, not a name), each at most MaxImageBytes. They
	// are checked before anything is sent, and so is the model: one whose
	// capabilities (/api/show) lack vision fails with ErrNoVision.
	Images []api.ImageData
	// Format asks for structured output: the JSON string "json", or a JSON
	// schema object (json.RawMessage(`{"type":"object",...}`)). Empty:
	// free text.
	Format json.RawMessage
	// Timeouts override the client's for this call (zero fields inherit).
	Timeouts Timeouts
}

// Chunk is one streamed piece of a generation or a chat, with progress so
// far.
type Chunk struct {
	Text     string // the new text in this chunk
	Thinking string // the new thinking text, for models that report it separately
	// ToolCalls are the tool calls this chunk of a chat reply carries.
	ToolCalls []api.ToolCall
	Index     int // 1 for the first chunk
	Bytes     int // bytes of text received so far, this chunk included
	Elapsed   time.Duration
	Done      bool
}

// ChunkFunc receives chunks in order. Returning an error stops the
// generation (the server-side request is canceled) and GenerateStreaming
// returns a KindCanceled error wrapping it.
type ChunkFunc func(Chunk) error

// Generation is the result of a successful generation or chat.
type Generation struct {
	Model    string
	Text     string // the reply: a generation's response, a chat's message content
	Thinking string
	// ToolCalls are the tools a chat's model asked to call, in order.
	ToolCalls  []api.ToolCall
	DoneReason string // "stop", "length", ...; "" (unknown) from the CLI fallback
	Chunks     int
	Metrics    api.Metrics
	// Loaded reports that this request loaded the model: the load
	// duration the server reported reached Options.LoadThreshold. Ollama
	// reports a load to every request that waited for it; of this
	// client's calls that ran at once and waited for one load (the same
	// num_ctx, their waits ending within 5 ms, at most LoadThreshold/2, of
	// each other on the server's clock), only the first to finish reports
	// it, so one load is counted once.
	Loaded bool
	// Offload is set when this generation loaded the model (Loaded) and
	// Ollama put part of it on the CPU; nil when it is all on the GPU.
	// It needs Options.VRAM: a server whose reader sees no device, or
	// whose snapshot fails, is never flagged (a CPU-only server lists
	// size_vram 0). The check reads /api/ps once per load, after the
	// generation, or at its first chunk with KeepAliveUnload (the model
	// may be gone by the end) or Options.FailOnOffload.
	Offload *Offload
	// Fallback reports that the subprocess fallback produced the text.
	// Such a generation has no Metrics, and DoneReason "length" when the
	// library stopped the CLI at num_predict (counted approximately, see
	// Options.Fallback), "" (unknown) otherwise: `ollama run` prints the
	// text and exits 0 whether or not the server's done line arrived, so a
	// reply the server cut short looks like a complete one. With Format,
	// a text that is not JSON, or not of the schema's basic shape, is no
	// success but ErrFormatMismatch (see FallbackTextError).
	Fallback bool
	// DroppedOptions lists, sorted, the request options the fallback did
	// not apply (only with Options.FallbackDropOptions); nil otherwise.
	DroppedOptions []string
	// Reload is set when this generation loaded a model that this client
	// had used or unloaded within Options.ReloadWindow: it says why the
	// model had left (see ReloadCause). Nil for a first load, a reuse and
	// the CLI fallback.
	Reload     *ReloadEvent
	FirstChunk time.Duration // time to the first chunk
	Elapsed    time.Duration
}

func validModelName(op, model string) error {
	switch {
	case strings.TrimSpace(model) == "":
		return invalid(op, model, "model name is empty")
	case !utf8.ValidString(model):
		return invalid(op, "", "model name is not valid UTF-8")
	case len(model) > 512:
		return invalid(op, "", "model name is longer than 512 bytes")
	case strings.ContainsAny(model, " \t\r\n\x00"):
		return invalid(op, model, "model name contains white space or NUL")
	}
	return nil
}

func (r *GenerateRequest) validate(op string) error {
	if r == nil {
		return invalid(op, "", "request is nil")
	}
	if err := validCommon(op, r.Model, r.Timeouts, r.Options, r.Format); err != nil {
		return err
	}
	if len(r.Prompt)+len(r.System) > MaxPromptBytes {
		return invalid(op, r.Model, "prompt of %d bytes exceeds %d", len(r.Prompt)+len(r.System), MaxPromptBytes)
	}
	if !utf8.ValidString(r.Prompt) || !utf8.ValidString(r.System) {
		return invalid(op, r.Model, "prompt is not valid UTF-8")
	}
	var total int
	for i, img := range r.Images {
		if err := validImage(op, r.Model, fmt.Sprintf("image %d", i+1), img, &total); err != nil {
			return err
		}
	}
	return nil
}

// validCommon checks what generations and chats share: the model's
// name, the timeouts, the options and the format.
func validCommon(op, model string, t Timeouts, opts map[string]any, format json.RawMessage) error {
	if err := validModelName(op, model); err != nil {
		return err
	}
	if err := t.validate(op); err != nil {
		if e, ok := err.(*Error); ok {
			e.Model = model
		}
		return err
	}
	for k, v := range opts {
		if err := validOption(v, 0); err != nil {
			return invalid(op, model, "option %q: %v", k, err)
		}
	}
	return validFormat(op, model, format)
}

// GenerateStreaming runs one generation, streaming chunks to fn (which may
// be nil), and returns the whole text.
//
// keepAlive is sent explicitly (see KeepAlive). The first-chunk, idle and
// total timeouts each cancel the HTTP request, so the server stops and drops
// its reference to the model. A stream that ends without the server's
// done:true is never a success: it is a KindTransient error wrapping
// ErrIncompleteStream, or the timeout or crash that cut it.
//
// When ctx is done the call returns a KindCanceled error wrapping
// context.Cause(ctx), unless the done line had already arrived: a
// generation that reached it is complete, and a cancel or a timeout after
// it does not undo that. With Options.Fallback, a timeout or transient failure
// is retried once through `ollama run`, provided no chunk had reached fn
// yet; a failure of both returns the first error's kind with both causes.
// The CLI cannot carry images: such a request is not retried
// (ErrFallbackUnsupported). A generation by the CLI reports DoneReason ""
// (unknown), since the CLI hides how the reply ended, and with
// Format its text must parse as the format asks (ErrFormatMismatch).
//
// Images and Format are checked before anything is sent (KindInvalidInput:
// ErrImageFormat, ErrImageTooLarge, a Format that is neither "json" nor a
// schema object); a request with images first asks the server whether the
// model can see them (/api/show, within the call's timeouts), and fails
// with ErrNoVision if not, before the model is loaded. Every server version
// tested lists capabilities; where one does not, the server decides:
// llama-server (Ollama v0.30+) refuses after loading, which is the same
// ErrNoVision, while older runners answer as if there were no image.
//
// With Options.VRAM, a load that put the model partly on the CPU is
// reported in Generation.Offload (which Hooks.OnCallEnd sees) and the log; with
// Options.FailOnOffload the call fails instead (KindOutOfMemory,
// ErrOffloaded) and unloads the model.
func (c *OllamaClient) GenerateStreaming(ctx context.Context, req *GenerateRequest, keepAlive KeepAlive, fn ChunkFunc) (*Generation, error) {
	const op = "generate"
	if err := req.validate(op); err != nil {
		return nil, err
	}
	r := *req
	r.Format = normFormat(r.Format)
	cl := &call{
		op:       op,
		model:    r.Model,
		options:  r.Options,
		timeouts: r.Timeouts,
		images:   len(r.Images) > 0,
		cli:      &r,
		send: func(ctx context.Context, own bool, ka *api.Duration, fn func(piece) error) error {
			ar := &api.GenerateRequest{
				Model:     r.Model,
				Prompt:    r.Prompt,
				System:    r.System,
				Options:   r.Options,
				Images:    r.Images,
				Format:    r.Format,
				KeepAlive: ka,
			}
			if r.Think != nil {
				ar.Think = &api.ThinkValue{Value: *r.Think}
			}
			h := func(g api.GenerateResponse) error {
				return fn(piece{text: g.Response, thinking: g.Thinking, done: g.Done, doneReason: g.DoneReason, metrics: g.Metrics, at: g.CreatedAt})
			}
			if own {
				return c.generateNDJSON(ctx, ar, h)
			}
			return c.api.Generate(ctx, ar, h)
		},
	}
	if cl.images {
		cl.cli, cl.noCLI = nil, "images"
	}
	return c.run(ctx, cl, keepAlive, fn)
}

// call is one generation or chat, validated and ready to stream.
type call struct {
	op       string
	model    string
	options  map[string]any
	timeouts Timeouts
	images   bool // the model must see images (checkVision)
	// send streams the request with the keep-alive ka, through the
	// client's own reader (own) or the api client, calling fn per reply
	// line.
	send func(ctx context.Context, own bool, ka *api.Duration, fn func(piece) error) error
	// cli is what the CLI fallback runs; nil when the CLI cannot carry the
	// call, and then noCLI says what it cannot carry.
	cli   *GenerateRequest
	noCLI string
}

// piece is one reply line of a generation or a chat, reduced to what the
// stream reads.
type piece struct {
	text, thinking string
	toolCalls      []api.ToolCall
	done           bool
	doneReason     string
	metrics        api.Metrics
	at             time.Time // created_at, on the server's clock
}

// errCallPanicked is OnCallEnd's Err for a call whose ChunkFunc panicked.
var errCallPanicked = errors.New("the call panicked (its chunk function, or a hook)")

// run is the path every generation and chat takes: checks, admission,
// the book's accounting, the stream, the offload check and the fallback.
// The call hooks see it whole: OnCallEnd runs also when fn panics (with
// the panic as Err, before the panic goes on).
func (c *OllamaClient) run(ctx context.Context, cl *call, keepAlive KeepAlive, fn ChunkFunc) (gen *Generation, err error) {
	h := &c.opts.Hooks
	if h.OnCallStart != nil || h.OnCallEnd != nil {
		cs := CallStart{Op: cl.op, Model: cl.model, Server: c.host, Start: time.Now()}
		ctx = hookStart(c, h.OnCallStart, ctx, cs)
		ended := false
		defer func() {
			end := CallEnd{CallStart: cs, Elapsed: time.Since(cs.Start), Generation: gen, Err: err}
			if !ended { // a panic, which goes on with its own value and stack
				end.Generation, end.Err = nil, newError(cl.op, cl.model, KindInternal, errCallPanicked)
			}
			hookCtx(c, h.OnCallEnd, ctx, end)
		}()
		gen, err = c.runCall(ctx, cl, keepAlive, fn)
		ended = true
		return gen, err
	}
	return c.runCall(ctx, cl, keepAlive, fn)
}

// startCall registers a call that has not begun its generation yet:
// EnsureFree and Phase.End's hand-over wait for the calls started before
// them until their generation begins, since a call still being admitted
// (or asking about its model) is a load they cannot see. Without a VRAM
// reader there is no such wait to serve.
func (c *OllamaClient) startCall() (begun func()) {
	if c.opts.VRAM == nil {
		return func() {}
	}
	return c.book.start()
}

func (c *OllamaClient) runCall(ctx context.Context, cl *call, keepAlive KeepAlive, fn ChunkFunc) (*Generation, error) {
	op := cl.op
	start := time.Now()
	if err := keepAlive.validate(); err != nil {
		return nil, newError(op, cl.model, KindInvalidInput, err)
	}
	if err := c.checkOpen(op, cl.model); err != nil {
		return nil, err
	}
	begun := c.startCall()
	defer begun()
	var spent time.Duration // the capabilities question counts against the timeouts
	if cl.images {
		start := time.Now()
		if err := c.checkVision(ctx, op, cl.model, cl.timeouts.or(c.opts.Timeouts)); err != nil {
			return nil, err
		}
		spent = time.Since(start)
	}
	// A keep-alive of 0 would unload a model that a lease (or a live
	// phase of this client) keeps, as soon as this request ends: the
	// request leaves the keep-alive as it is instead, and the guard's
	// cleanup sees the lease.
	if keepAlive == KeepAliveUnload && (c.phaseKeeps(cl.model) || len(c.heldLeases(cl.model)) > 0) {
		c.log.Debug("leased model: keep-alive left as the server has it", "model", cl.model)
		keepAlive = KeepAliveServerDefault
	}
	// Options.Budget: a load is admitted before the request goes out,
	// within the call's timeouts (FirstChunk covers queueing and load).
	admitted, landed, err := c.admitBounded(ctx, cl, &spent)
	if err != nil {
		return nil, err
	}
	defer admitted()
	// An unload of the model by this client cuts the request while it
	// has no chunk yet (cancelLoads).
	fctx, fcancel := context.WithCancelCause(ctx)
	defer fcancel(nil)
	f, end, err := c.book.begin(op, cl.model, keepAlive, fcancel, false)
	begun()
	if err != nil {
		return nil, err
	}
	fctx = httptrace.WithClientTrace(fctx, &httptrace.ClientTrace{WroteHeaders: func() { f.sent.Store(true) }})
	st := &streamState{flight: f, spent: spent, landed: landed}
	// Checked at the first chunk when the model may be gone by the end,
	// or when an offloaded model must not generate at all.
	st.checkOffload = c.opts.VRAM != nil && (c.opts.FailOnOffload || keepAlive == KeepAliveUnload)
	gen, err := func() (*Generation, error) {
		defer end() // also when fn panics: a dead generation must not block unloads
		return c.stream(fctx, cl, keepAlive, fn, st)
	}()
	if errors.Is(err, errOffloadStop) {
		return nil, c.failOffloaded(ctx, op, cl.model, st.offload)
	}
	if err != nil && (nothingLoaded(err) || st.refused && !f.sent.Load()) {
		c.book.unsent(f)
	}
	if err != nil {
		c.churn.connLost(err, time.Now())
	}
	if err == nil {
		c.succeeded(ctx, cl, gen, st, keepAlive, start)
		return gen, nil
	}
	// The fallback starts the text again: it runs only if fn has seen
	// none of it, so a caller never receives text twice.
	var e *Error
	if !c.opts.Fallback || !errors.As(err, &e) || !e.Kind.Retryable() || ctx.Err() != nil || (fn != nil && st.chunks > 0) {
		return nil, err
	}
	if cl.cli == nil {
		c.log.Debug("request failed; the ollama CLI cannot carry it", "op", op, "model", cl.model, "what", cl.noCLI)
		return nil, newError(op, cl.model, e.Kind, errors.Join(e.Err,
			fmt.Errorf("fallback refused: %w: %s", ErrFallbackUnsupported, cl.noCLI)))
	}
	req := cl.cli
	// The CLI cannot carry most options: dropping a seed or a temperature
	// silently would return a text the caller did not ask for.
	_, dropped := cliOptions(req.Options)
	if len(dropped) > 0 && !c.opts.FallbackDropOptions {
		c.log.Debug("generation failed; the ollama CLI cannot carry its options", "model", req.Model, "options", dropped)
		return nil, newError(op, req.Model, e.Kind, errors.Join(e.Err,
			fmt.Errorf("fallback refused: %w: %s", ErrFallbackUnsupported, strings.Join(dropped, ", "))))
	}
	hookCtx(c, c.opts.Hooks.OnFallback, ctx, FallbackEvent{Model: req.Model, Server: c.host, Err: err})
	c.log.Warn("generation failed; trying the ollama CLI", "model", req.Model, "err", err)
	if len(dropped) > 0 {
		c.log.Warn("the ollama CLI runs without options it cannot carry", "model", req.Model, "dropped", dropped)
	}
	gen, ferr := c.generateCLI(ctx, req, keepAlive, fn)
	if ferr != nil {
		return nil, newError(op, req.Model, e.Kind, errors.Join(e.Err, fmt.Errorf("fallback: %w", ferr)))
	}
	gen.DroppedOptions = dropped
	return gen, nil
}

// succeeded reports a successful call's load or reuse, its reload, if any,
// and its offload.
func (c *OllamaClient) succeeded(ctx context.Context, cl *call, gen *Generation, st *streamState, keepAlive KeepAlive, start time.Time) {
	c.noteLoad(ctx, gen, keepAlive, cl.options, start, loadEnd(st, gen.Metrics))
	c.reportLoad(gen)
	if !gen.Loaded {
		return
	}
	off := st.offload
	if !st.checkOffload {
		off = c.offloadOf(ctx, cl.model, time.Now())
	}
	if off != nil {
		gen.Offload = off
		c.reportOffload(cl.model, off)
	}
}

func (c *OllamaClient) reportLoad(gen *Generation) {
	if gen.Loaded {
		c.log.Debug("model loaded", "model", gen.Model, "load", gen.Metrics.LoadDuration)
	}
}

// streamState is what the chunk callback accumulates.
type streamState struct {
	// refused: the client's transport failed the request with its own
	// *Error (a pool's placement refusal, or a member's failure); with the
	// flight not sent, no server received it.
	refused    bool
	start      time.Time
	spent      time.Duration // before the request: the vision check
	text       strings.Builder
	thinking   strings.Builder
	toolCalls  []api.ToolCall
	chunks     int
	done       bool
	last       piece // the done line's fields
	firstChunk time.Duration
	fnErr      error
	flight     *flight // marked streaming at the first chunk; nil for none
	// checkOffload: read /api/ps at the first chunk; offload is what
	// that found (nil: nothing to flag).
	checkOffload bool
	offload      *Offload
	// landed is called at the first chunk: the model's load, if the
	// budget admitted one, has landed (its host-wide reservation ends).
	landed func()
}

// stream runs the generation or chat; st, zero on entry, is left with what
// it received (run reads st.chunks after a failure).
func (c *OllamaClient) stream(ctx context.Context, cl *call, ka KeepAlive, fn ChunkFunc, st *streamState) (*Generation, error) {
	op, model := cl.op, cl.model
	t := cl.timeouts.or(c.opts.Timeouts)

	wd := newWatchdog(ctx, t, st.spent)
	defer wd.release()

	st.start = wd.start
	// The client's own reader when it owns the HTTP client (ndjson.go,
	// internal/wire): no line limit for the done line's context array, no
	// 8 MiB buffer.
	own := c.readsOwnStream()
	err := cl.send(wd.ctx, own, ka.apiDuration(), func(r piece) error {
		elapsed := time.Since(st.start) // one clock read per chunk
		first := st.chunks == 0
		if first {
			st.firstChunk = elapsed
			if st.flight != nil {
				st.flight.streaming.Store(true)
			}
			if st.landed != nil {
				st.landed()
			}
		}
		wd.chunkAt(elapsed) // the idle timeout covers the check below
		if first && st.checkOffload {
			// The model is listed by now: Ollama lists a runner once loaded.
			st.offload = c.offloadOf(wd.ctx, model, time.Now())
			if st.offload != nil && c.opts.FailOnOffload {
				return errOffloadStop // before fn sees any text
			}
		}
		st.chunks++
		st.text.WriteString(r.text)
		st.thinking.WriteString(r.thinking)
		st.toolCalls = append(st.toolCalls, r.toolCalls...)
		if r.done {
			st.done = true
			st.last = r
		}
		if fn != nil {
			if err := fn(Chunk{
				Text:      r.text,
				Thinking:  r.thinking,
				ToolCalls: r.toolCalls,
				Index:     st.chunks,
				Bytes:     st.text.Len(),
				Elapsed:   elapsed,
				Done:      r.done,
			}); err != nil {
				st.fnErr = err
				return err
			}
		}
		return nil
	})
	st.refused = transportRefused(err) != nil
	if st.offload != nil && c.opts.FailOnOffload {
		return nil, errOffloadStop // run unloads and fails
	}
	if werr := wd.finish(op, model, ctx, st.fnErr); werr != nil {
		if !st.done || st.fnErr != nil {
			return nil, werr
		}
		// The done line came before the cancel or the timeout: the
		// generation is complete, whatever the reading of the reply's
		// end then returned.
		err = nil
	}
	if err := streamError(op, model, own, st, err); err != nil {
		return nil, err
	}
	return &Generation{
		Model:      model,
		Text:       st.text.String(),
		Thinking:   st.thinking.String(),
		ToolCalls:  st.toolCalls,
		DoneReason: st.last.doneReason,
		Chunks:     st.chunks,
		Metrics:    st.last.metrics,
		Loaded:     st.last.metrics.LoadDuration >= c.opts.LoadThreshold,
		FirstChunk: st.firstChunk,
		Elapsed:    time.Since(st.start),
	}, nil
}

// streamError classifies how a stream ended: nil for a complete one, else
// the typed failure (own: the client's own reader read it).
func streamError(op, model string, own bool, st *streamState, err error) error {
	var cut *wire.CutError
	switch {
	case errors.As(err, &cut) && !st.done:
		// Our reader: the body ended or broke inside the stream.
		return newError(op, model, KindTransient,
			fmt.Errorf("%w after %d chunks: %w", ErrIncompleteStream, st.chunks, err))
	case errors.As(err, &cut):
		return newError(op, model, KindTransient, err)
	case errors.Is(err, wire.ErrMalformedLine) || errors.Is(err, ErrReplyTooLarge):
		// A line that the same request would get again: not retryable.
		return newError(op, model, KindServer, err)
	case !own && err != nil && !st.done && isPartialLine(err):
		// The connection was cut inside a line: the api client hands the
		// partial line over as an error text. It is a cut stream, not a
		// server's verdict.
		return newError(op, model, KindTransient,
			fmt.Errorf("%w after %d chunks: partial line %.40q", ErrIncompleteStream, st.chunks, err.Error()))
	case !own && err != nil && !st.done && isCutStream(err):
		// From Ollama v0.30 the api client returns the reader's error when
		// the stream breaks (v0.17 returned nil): a cut stream either way.
		return newError(op, model, KindTransient,
			fmt.Errorf("%w after %d chunks: %w", ErrIncompleteStream, st.chunks, err))
	case err != nil:
		return serverError(op, model, err)
	case !st.done:
		return newError(op, model, KindTransient,
			fmt.Errorf("%w after %d chunks", ErrIncompleteStream, st.chunks))
	}
	return nil
}

// isCutStream reports whether err is a failure to read the rest of the
// reply stream (a connection cut mid-reply, a line past the api client's
// buffer), as opposed to a verdict of the server.
func isCutStream(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, bufio.ErrTooLong) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed)
}

// isPartialLine reports whether err is the api client's rendering of a
// JSON line that was cut short: a plain error whose text starts like an
// object but does not parse.
func isPartialLine(err error) bool {
	var se api.StatusError
	if errors.As(err, &se) {
		return false
	}
	msg := strings.TrimSpace(err.Error())
	return strings.HasPrefix(msg, "{") && !json.Valid([]byte(msg))
}

// validOption reports whether v, a value of GenerateRequest.Options, can be
// sent: JSON-encodable, with finite numbers.
func validOption(v any, depth int) error {
	if depth > 8 {
		return errors.New("nested too deep")
	}
	switch x := v.(type) {
	case nil, bool, string, int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, json.Number:
		return nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return fmt.Errorf("%v is not a finite number", x)
		}
		return nil
	case float32:
		return validOption(float64(x), depth)
	case []any:
		for _, e := range x {
			if err := validOption(e, depth+1); err != nil {
				return err
			}
		}
		return nil
	case []string, []int, []float64:
		if f, ok := x.([]float64); ok {
			for _, e := range f {
				if err := validOption(e, depth); err != nil {
					return err
				}
			}
		}
		return nil
	case map[string]any:
		for _, e := range x {
			if err := validOption(e, depth+1); err != nil {
				return err
			}
		}
		return nil
	}
	if _, err := json.Marshal(v); err != nil {
		return err
	}
	return nil
}
