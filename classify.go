package vramguard

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"

	"github.com/ollama/ollama/api"
)

// This file is the only place that reads Ollama's error texts. The texts are
// those of Ollama v0.6.5 to v0.17.4 (see the README's compatibility table).

var (
	crashTexts = []string{
		"llama runner process has terminated",
		"model runner has unexpectedly stopped",
		"an error was encountered while running the model",
		"unexpected eof",
		"runner process no longer running",
	}
	oomTexts = []string{
		"out of memory",
		"cuda error",
		"unable to allocate",
		"requires more system memory",
		"insufficient memory",
		"vram grow failed",
		"cudamalloc failed",
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
	case containsAny(m, busyTexts):
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

// classifyStatus classifies an HTTP error status and its message.
func classifyStatus(code int, msg string) Kind {
	if k := classifyMessage(msg); k == KindOutOfMemory || k == KindModelCrash {
		return k
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
