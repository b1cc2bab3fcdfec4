package vramguard_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	. "github.com/vramguard/vramguard"

	"github.com/ollama/ollama/api"
	"github.com/vramguard/vramguard/internal/testkit/faultproxy"
	"github.com/vramguard/vramguard/vramguardtest"
)

// newSim starts a simulator with the given models; it is closed at the end
// of the test.
func newSim(t testing.TB, cfg vramguardtest.Config, models ...vramguardtest.ModelConfig) *vramguardtest.Server {
	t.Helper()
	cfg.Models = append(cfg.Models, models...)
	s := vramguardtest.New(cfg)
	t.Cleanup(s.Close)
	return s
}

// newTestClient returns a client for s with fast polling; it is closed at
// the end of the test and must close cleanly.
func newTestClient(t testing.TB, s *vramguardtest.Server, opts Options) *OllamaClient {
	t.Helper()
	return newClientAt(t, s.URL().String(), opts)
}

// newClientAt is newTestClient for a server at host (a fault proxy).
func newClientAt(t testing.TB, host string, opts Options) *OllamaClient {
	t.Helper()
	opts.Host = host
	if opts.PollInterval == 0 {
		opts.PollInterval = 5 * time.Millisecond
	}
	if opts.UnloadTimeout == 0 {
		opts.UnloadTimeout = 5 * time.Second
	}
	c, err := NewClient(opts)
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

// eventually waits for cond on the simulator's state changes.
func eventually(t *testing.T, s *vramguardtest.Server, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := s.WaitFor(ctx, cond); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// endpoint is one way to stream a reply: every streaming contract holds
// for each (endpoints).
type endpoint struct {
	name string
	run  func(ctx context.Context, c *OllamaClient, req *GenerateRequest, ka KeepAlive, fn ChunkFunc) (*Generation, error)
}

// endpoints returns generation and chat, the chat carrying req as a
// system and a user message.
func endpoints() []endpoint {
	return []endpoint{
		{"generate", func(ctx context.Context, c *OllamaClient, req *GenerateRequest, ka KeepAlive, fn ChunkFunc) (*Generation, error) {
			return c.GenerateStreaming(ctx, req, ka, fn)
		}},
		{"chat", func(ctx context.Context, c *OllamaClient, req *GenerateRequest, ka KeepAlive, fn ChunkFunc) (*Generation, error) {
			return c.ChatStreaming(ctx, chatOf(req), ka, fn)
		}},
	}
}

// chatOf is the chat that asks what req asks.
func chatOf(req *GenerateRequest) *ChatRequest {
	if req == nil {
		return nil
	}
	var msgs []api.Message
	if req.System != "" {
		msgs = append(msgs, api.Message{Role: "system", Content: req.System})
	}
	msgs = append(msgs, api.Message{Role: "user", Content: req.Prompt, Images: req.Images})
	return &ChatRequest{Model: req.Model, Messages: msgs, Format: req.Format, Think: req.Think, Options: req.Options, Timeouts: req.Timeouts}
}

// unloadSpy returns an HTTP client whose transport calls sent with the
// model of each unload request (a generate with no prompt and keep_alive
// 0) as it goes out, before the server sees it: the moment Hooks no longer
// report on their own (OnUnloadStart is the unload's, not each request's).
func unloadSpy(sent func(model string)) *http.Client {
	return &http.Client{Transport: spyTransport{next: http.DefaultTransport.(*http.Transport).Clone(), sent: sent}}
}

type spyTransport struct {
	next http.RoundTripper
	sent func(model string)
}

func (s spyTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path == "/api/generate" && req.Body != nil {
		body, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		req.Body = io.NopCloser(bytes.NewReader(body))
		if (&faultproxy.Request{Method: req.Method, Path: req.URL.Path, Body: body}).IsUnload() {
			var m struct {
				Model string `json:"model"`
			}
			_ = json.Unmarshal(body, &m)
			s.sent(m.Model)
		}
	}
	return s.next.RoundTrip(req)
}
