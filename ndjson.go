package vramguard

import (
	"context"
	"io"
	"net/http"

	"github.com/ollama/ollama/api"
	"github.com/ollama/ollama/envconfig"

	"github.com/vramguard/vramguard/internal/wire"
)

// This file is the client's side of its own reader of Ollama's
// /api/generate and /api/chat replies (internal/wire): the reader checks
// the done line's context array and drops it as it reads, where the api
// client stops at a line over 8 MiB and allocates an 8 MiB buffer per
// call (the package doc of internal/wire has the story).
//
// It is used when the client built its own HTTP client (Options.Host and
// Options.HTTPClient). With Options.API, or when the api client would
// sign its requests (host ollama.com, or OLLAMA_AUTH set), generations go
// through api.Client.Generate and keep its 8 MiB line limit.

// ErrReplyTooLarge is the cause of the KindServer error returned when one
// line of a generation's reply, not counting its context array, is over
// 64 MiB. Lines carry a piece of text each, so a request cannot cause
// this and the same call would fail again: it is not retryable.
var ErrReplyTooLarge = wire.ErrReplyTooLarge

// readsOwnStream reports whether generations go through generateNDJSON:
// the client owns its HTTP client, and the api client would not sign the
// request (it does for ollama.com and with OLLAMA_AUTH).
func (c *OllamaClient) readsOwnStream() bool {
	return c.hc != nil && c.base != nil && c.base.Hostname() != "ollama.com" && !envconfig.UseAuth()
}

// generateNDJSON is api.Client.Generate read by wire.Reader: the same
// request (req as JSON, POST <base>/api/generate), a status of 400 and up
// answered with the same api.StatusError (or api.AuthorizationError), and
// an {"error": ...} line with the same plain error. It differs in what the
// api client hides or cannot read: a body that ends or fails to read
// inside the stream is a *wire.CutError, a malformed line wraps
// wire.ErrMalformedLine, a line too long to keep wraps ErrReplyTooLarge,
// and lines of any length are read when what makes them long is the
// context array.
func (c *OllamaClient) generateNDJSON(ctx context.Context, req *api.GenerateRequest, fn api.GenerateResponseFunc) error {
	return c.readNDJSON(ctx, "/api/generate", req, func(l *wire.Line) error { return fn(l.GenerateResponse) })
}

// chatNDJSON is api.Client.Chat read by wire.Reader, as generateNDJSON is
// api.Client.Generate.
func (c *OllamaClient) chatNDJSON(ctx context.Context, req *api.ChatRequest, fn api.ChatResponseFunc) error {
	return c.readNDJSON(ctx, "/api/chat", req, func(l *wire.Line) error { return fn(l.Chat()) })
}

// readNDJSON posts req to path and calls fn with each reply line.
func (c *OllamaClient) readNDJSON(ctx context.Context, path string, req any, fn func(*wire.Line) error) error {
	resp, err := c.postJSON(ctx, path, req, "application/x-ndjson")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	rr := wire.NewReader(resp.Body, wire.BufferSize, wire.MaxLine)
	for {
		l, err := rr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(l); err != nil {
			return err
		}
	}
}

// postJSON sends req as JSON to path through the client's own HTTP
// client. A status of 400 and up comes back as the error the api client
// would return (wire.ReadStatusError), with the body closed.
func (c *OllamaClient) postJSON(ctx context.Context, path string, req any, accept string) (*http.Response, error) {
	hreq, err := wire.NewRequest(ctx, c.base.JoinPath(path).String(), req, accept)
	if err != nil {
		return nil, err
	}
	resp, err := c.hc.Do(hreq)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= http.StatusBadRequest {
		defer resp.Body.Close()
		return nil, wire.ReadStatusError(resp)
	}
	return resp, nil
}
