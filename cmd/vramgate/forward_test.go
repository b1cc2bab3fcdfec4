package main

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// A request the gate passes through (an upload to /api/blobs, /api/show,
// anything it does not admit) is full duplex: Ollama may answer before
// the gate has forwarded the body's end, and the answer reaches the
// client whole while the body still flows. Without it, Go's server
// closes the request body as the answer's header goes out, the proxy's
// last read of the body fails, and the proxy cuts Ollama's answer: a 200
// with a truncated body, seen on v0.34.4's /api/show in 1 of about 100
// requests (TestGateKeepsOllamasGuards, CI of 2026-12-05). Here the
// client sends the body's second half only once the answer's header has
// arrived, which a half-duplex gate never lets happen.
func TestPassThroughIsFullDuplex(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/ps", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"models":[]}`)
	})
	mux.HandleFunc("POST /api/blobs/{digest}", func(w http.ResponseWriter, r *http.Request) {
		if err := http.NewResponseController(w).EnableFullDuplex(); err != nil {
			t.Error(err)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintln(w, "header sent")
		_ = http.NewResponseController(w).Flush()
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "read %d bytes, %v\n", len(b), err)
	})
	up := httptest.NewServer(mux)
	t.Cleanup(up.Close)
	g := startGate(t, up.URL, nil)

	const half = 1000
	pr, pw := io.Pipe()
	req, err := http.NewRequestWithContext(t.Context(), "POST", g.URL+"/api/blobs/sha256:00", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = 2 * half
	go func() {
		_, _ = pw.Write(make([]byte, half))
	}()
	type answer struct {
		resp *http.Response
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		got <- answer{resp, err}
	}()
	var a answer
	select {
	case a = <-got:
	case <-time.After(20 * time.Second):
		_ = pw.CloseWithError(fmt.Errorf("test over"))
		t.Fatal("no answer's header within 20 s while the body's second half waits for it: the gate is not full duplex")
	}
	if a.err != nil {
		t.Fatal(a.err)
	}
	defer a.resp.Body.Close()
	if _, err := pw.Write(make([]byte, half)); err != nil {
		t.Fatal(err)
	}
	_ = pw.Close()
	b, err := io.ReadAll(a.resp.Body)
	if err != nil || a.resp.StatusCode != http.StatusCreated || string(b) != "header sent\nread 2000 bytes, <nil>\n" {
		t.Fatalf("through the gate: %d %q, %v; want 201 and Ollama's whole answer, the whole body read", a.resp.StatusCode, b, err)
	}
}
