package vramguard_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// A proxy in front of Ollama admits each forwarded request's load through
// the library's one door: with Budget.MaxLoaded 1 and another model
// resident, the load first unloads it, verified, by the victim policy; the
// model counts in use while the request runs. Ollama answering the
// request (its reply's headers) is when the load has landed.
func ExampleOllamaClient_Admit() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "llama3.2", Size: 2 << 30}, {Name: "qwen3:8b", Size: 5 << 30}}})
	defer s.Close()
	c, err := vramguard.NewClient(vramguard.Options{
		Host:   s.URL().String(),
		Budget: &vramguard.Budget{MaxLoaded: 1, OffWithoutGPU: true}, // slots need no GPU reader
	})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "x"},
		vramguard.KeepAliveForever, nil); err != nil {
		log.Fatal(err)
	}

	forward := func(w http.ResponseWriter, r *http.Request, model string) {
		err := c.Admit(r.Context(), model, nil, vramguard.ReserveOptions{For: r.RemoteAddr},
			func(ctx context.Context, ev vramguard.AdmissionEvent, landed func()) error {
				for _, e := range ev.Evicted {
					fmt.Println("unloaded", e.Model, "verified:", e.Verified)
				}
				proxy := &httputil.ReverseProxy{
					Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(s.URL()) },
					// Ollama's reply headers come once the load has landed
					// (or failed): the load's reservation ends there, not at
					// the end of the generation.
					ModifyResponse: func(*http.Response) error { landed(); return nil },
				}
				proxy.ServeHTTP(w, r.WithContext(ctx))
				return nil
			})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		}
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("POST", "/api/generate", strings.NewReader(`{"model":"qwen3:8b","prompt":"hi","stream":false}`))
	forward(rec, req, "qwen3:8b")
	fmt.Println(rec.Code, s.Listed("qwen3:8b"), s.Listed("llama3.2"))
	// Output:
	// unloaded llama3.2:latest verified: true
	// 200 true false
}
