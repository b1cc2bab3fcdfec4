package vramguard

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"syscall"

	"github.com/ollama/ollama/api"
)

// This file is the only place that reads Ollama's error texts. The texts are
// those of Ollama v0.6.5 to v0.34.4: the `ollama runner` generation (up to
// v0.24) and the llama-server generation (v0.30 and later), which renamed
// several of them (see the README's compatibility table).

var (
	// crashTexts: the runner died, stopped answering or never became ready.
	crashTexts = []string{
		"llama runner process has terminated",    // load failure or crash, up to v0.24
		"llama-server process has terminated",    // the same, v0.30+
		"runner process no longer running",       // "llama runner process no longer running", up to v0.24
		"llama-server process no longer running", // v0.30+
		"model runner has unexpectedly stopped",
		// A load that failed without the runner's own message: v0.6.5's
		// "unable to load model: <blob path>", and v0.17+ "model failed to
		// load, this may be due to resource limitations or an internal
		// error, ..." when the runner exits before it reports (seen on
		// v0.17.4 with an unloadable model, about one load in three).
		"unable to load model",
		"model failed to load",
		// Mid-stream, when the runner's reply broke off: "...: unexpected
		// EOF" when the runner was killed. The bare "unexpected EOF" of a
		// cut connection to Ollama itself is no crash (classifyMessage).
		"an error was encountered while running the model",
		"error reading llama-server", // v0.30+: the runner's stream failed (reset, ...)
		// OLLAMA_LOAD_TIMEOUT (5 min) passed without load progress: the
		// runner hung while loading and Ollama gives up on it. Read in
		// v0.34.4 llm/llama_server.go WaitUntilRunning, which returns
		// "timed out waiting for llama-server to start - <last runner
		// error>" (v0.17.4: "... llama runner to start - progress 0.00 -").
		// Its other form, "...to start: <ctx.Err()>", wraps the loading
		// request's own cancellation and reaches nobody as text (Ollama
		// answers that request 499 "request canceled"). It is a failed
		// load, not one of this library's deadlines: KindTimeout would
		// make it retryable (and the fallback would wait the same minutes
		// again on the same stuck load), whereas a runner that cannot
		// start is what KindModelCrash means. A runner error in the text
		// that names memory still makes it KindOutOfMemory.
		"timed out waiting for llama runner to start",
		"timed out waiting for llama-server to start",
	}
	// oomTexts: memory ran out (the GPU's or the host's). Besides the older
	// texts, Ollama v0.34.4's own list (llm/status.go outOfMemorySubstrings)
	// and its load errors.
	oomTexts = []string{
		"out of memory",
		"out-of-memory", // "llama-server reported out-of-memory during startup: ..." (v0.30+)
		"out of device memory",
		"cuda error",
		"unable to allocate",
		"failed to allocate", // "failed to allocate memory for model", "... graph"
		"allocation failed",
		"not enough memory",
		"requires more system memory",
		"insufficient memory",
		"vram grow failed",
		"cudamalloc failed",
		"hipmalloc failed",
		"vk_error_out_of_device_memory",
		"erroroutofmemory",
		"erroroutofdevicememory",  // vulkan.hpp: "vk::Device::allocateMemory: ErrorOutOfDeviceMemory"
		"failed to reserve graph", // llama.cpp's graph reservation (v0.30+)
		"memory layout cannot be allocated",
		"failed to commit memory",
		"unable to load full model on gpu",
	}
	// contextTexts: the input does not fit the model's context (400, or a
	// 500 from the embedding truncation): the caller's input, not a fault.
	contextTexts = []string{
		"exceeds the context length",         // 400 "the input length exceeds the context length" (v0.30+)
		"exceeds maximum context length",     // "input (after truncation) exceeds maximum context length"
		"longer than the context length",     // 400 "the prompt is longer than the context length currently available ..."
		"exceeds the available context size", // llama-server's own 400 exceed_context_size_error
	}
	// serverTexts: the server cannot start a runner at all (a broken
	// install): KindServer, checked before the not-found rule because a
	// binary "not found" is no missing model.
	serverTexts = []string{
		"llama-server binary not found",
		"error starting llama-server",
		"error starting runner",
	}
	notFoundTexts = []string{
		"not found, try pulling it first",
		"not found",
		"file does not exist",
	}
	busyTexts = []string{
		"server busy",
		"maximum pending requests exceeded",
		"too many requests",
		"no slots available",       // v0.30+: the runner's slots stayed busy
		"unexpected server status", // v0.30+: the runner was not ready for a request
		// v0.30+: more than 100 identical tokens in a row end the
		// generation with this error line; up to v0.24 the same abort
		// ended the stream without done (a KindTransient incomplete
		// stream), so it keeps that kind.
		"token repeat limit reached",
	}
)

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// classifyMessage classifies a server error text with no status code, such as
// an {"error": ...} line received after the stream began, or the CLI's stderr.
func classifyMessage(msg string) Kind {
	m := strings.ToLower(msg)
	switch {
	case containsAny(m, oomTexts):
		return KindOutOfMemory
	case containsAny(m, crashTexts):
		return KindModelCrash
	case containsAny(m, contextTexts):
		return KindInvalidInput
	case containsAny(m, serverTexts):
		return KindServer
	case containsAny(m, busyTexts):
		return KindTransient
	case strings.Contains(m, "unexpected eof"):
		// A connection cut mid-reply, rendered as text (the CLI prints
		// "Error: unexpected EOF"): the crash form is matched above.
		return KindTransient
	case strings.Contains(m, "model") && containsAny(m, notFoundTexts):
		return KindNotFound
	case strings.Contains(m, "must be of type"), strings.Contains(m, "invalid option"):
		return KindInvalidInput // e.g. option "temperature" must be of type float32
	case strings.Contains(m, "connection refused"), strings.Contains(m, "could not connect"):
		return KindUnavailable
	case strings.Contains(m, "request canceled"):
		return KindTransient
	}
	return KindServer
}

// runnerUnreachableTexts are whole 500 replies that Ollama sends when its
// runner's health check fails before a generation (v0.34.4
// getServerStatus): the runner, not Ollama, refused or hung.
var runnerUnreachableTexts = []string{"connection refused", "server not responding"}

// classifyStatus classifies an HTTP error status and its message.
func classifyStatus(code int, msg string) Kind {
	if k := classifyMessage(msg); k == KindOutOfMemory || k == KindModelCrash {
		return k
	}
	if code == http.StatusInternalServerError && slices.Contains(runnerUnreachableTexts, strings.ToLower(strings.TrimSpace(msg))) {
		return KindModelCrash
	}
	switch {
	case code == http.StatusNotFound:
		return KindNotFound
	case code == http.StatusBadRequest:
		return KindInvalidInput
	case code == http.StatusServiceUnavailable, code == http.StatusTooManyRequests,
		code == http.StatusBadGateway, code == http.StatusGatewayTimeout:
		return KindTransient
	case code == 499: // the server saw the request canceled; it was not ours
		return KindTransient
	case code == http.StatusRequestEntityTooLarge:
		return KindInvalidInput
	}
	return classifyMessage(msg)
}

// classify returns the kind of an error returned by the Ollama API client
// (not by a context: callers check their contexts first).
func classify(err error) Kind {
	if err == nil {
		return KindUnknown
	}
	var ve *Error
	if errors.As(err, &ve) {
		return ve.Kind
	}
	var se api.StatusError
	if errors.As(err, &se) {
		return classifyStatus(se.StatusCode, se.ErrorMessage)
	}
	var ae api.AuthorizationError
	if errors.As(err, &ae) {
		return KindServer
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return KindCanceled
	}
	// Nothing listens: there is no server to retry against.
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EHOSTUNREACH) ||
		errors.Is(err, syscall.ENETUNREACH) {
		return KindUnavailable
	}
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) {
		return KindUnavailable
	}
	// A connection that was cut: the server went away or restarted.
	if errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
		return KindTransient
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return KindTimeout
	}
	var oe *net.OpError
	if errors.As(err, &oe) {
		if oe.Op == "dial" {
			return KindUnavailable
		}
		return KindTransient
	}
	// Any other failure of the HTTP round trip itself ("http: server closed
	// idle connection", a broken TLS record, ...) is the transport's, not a
	// verdict of the server: those come as api.StatusError above.
	var ue *url.Error
	if errors.As(err, &ue) {
		return KindTransient
	}
	return classifyMessage(err.Error())
}

// visionTexts are the servers' refusals of images sent to a model that
// cannot see them.
var visionTexts = []string{
	"received image but vision model not loaded", // ollama runner (llama.cpp engine), up to v0.24
	"missing data required for image input",      // ollama runner (Ollama's engine)
	"image input is not supported",               // llama-server chat (500), v0.30+
	"does not support multimodal",                // llama-server completion (400), v0.30+
	"does not support vision",
}

// serverError wraps an error of the server (or of the way to it) with its
// kind, and with ErrNoVision when the server refused images.
func serverError(op, model string, err error) *Error {
	if containsAny(strings.ToLower(err.Error()), visionTexts) {
		return newError(op, model, KindInvalidInput, fmt.Errorf("%w: %w", ErrNoVision, err))
	}
	return newError(op, model, classify(err), err)
}

// nothingLoaded reports whether a failed request cannot have loaded its
// model: no connection was made (the server never received it), or the
// server answered 404 (it has no such model). Nor can a request its
// transport failed with its own *Error (transportRefused) before the
// call's trace saw its headers written: the stream records both.
func nothingLoaded(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return true
	}
	var se api.StatusError
	return errors.As(err, &se) && se.StatusCode == http.StatusNotFound
}

// transportRefused returns the transport's own *Error that err carries (a
// pool's refusal at its placement, or a member's failure it names), as
// net/http wraps it in a *url.Error naming an address no server has; nil
// if none.
func transportRefused(err error) *Error {
	var ue *url.Error
	var pe *Error
	if errors.As(err, &ue) && errors.As(ue.Err, &pe) {
		return pe
	}
	return nil
}
