package wire

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"testing"

	"github.com/ollama/ollama/api"
)

// TestNewRequest: the request is the api client's: a POST of the value
// as encoding/json encodes it, its length known, with the content type and the accept header
// given.
func TestNewRequest(t *testing.T) {
	stream := false
	in := &api.GenerateRequest{Model: "tiny", KeepAlive: &api.Duration{}, Stream: &stream}
	req, err := NewRequest(t.Context(), "http://127.0.0.1:11434/api/generate", in, "application/json")
	if err != nil {
		t.Fatal(err)
	}
	if req.Method != http.MethodPost || req.URL.Path != "/api/generate" || req.Context() != t.Context() ||
		req.Header.Get("Content-Type") != "application/json" || req.Header.Get("Accept") != "application/json" {
		t.Fatalf("request %s %s, headers %v", req.Method, req.URL, req.Header)
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(in) // what api.Client.Generate sends
	if string(body) != string(want) || req.ContentLength != int64(len(want)) || req.GetBody == nil {
		t.Fatalf("body %s (length %d), want %s", body, req.ContentLength, want)
	}
}

// TestNewRequestUnencodable: a value JSON cannot encode is an error, and
// no request.
func TestNewRequestUnencodable(t *testing.T) {
	req, err := NewRequest(t.Context(), "http://127.0.0.1:11434/api/generate", map[string]any{"x": math.NaN()}, "application/json")
	if err == nil || req != nil {
		t.Fatalf("got %v, %v; want an error", req, err)
	}
}
