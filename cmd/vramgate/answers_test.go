package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/vramguardtest"
)

// refusalBody is what a client reads of a refusal.
type refusalBody struct {
	Error    string    `json:"error"`
	Reason   string    `json:"reason"`
	Blockers []blocker `json:"blockers"`
	Retry    float64   `json:"retry_after_seconds"`
}

func readRefusal(t *testing.T, code int, hdr http.Header, body string) refusalBody {
	t.Helper()
	var r refusalBody
	if err := json.Unmarshal([]byte(body), &r); err != nil {
		t.Fatalf("%d %s: %v", code, body, err)
	}
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" {
		t.Fatalf("%d (Retry-After %q) %s; want 503 with Retry-After", code, hdr.Get("Retry-After"), body)
	}
	if want := "retry after " + hdr.Get("Retry-After") + " s"; !strings.Contains(r.Error, want) {
		t.Fatalf("the error text %q does not say %q (Ollama's Go client keeps only the text)", r.Error, want)
	}
	return r
}

// A load that the gate's own -reserve rules out (it would fit the device,
// not with the reserve kept free) is a refusal like any other: 503 with
// Retry-After, the reserve named among the blockers, and the numbers the
// gate measured; not 502 "invalid input".
func TestReserveRefusal(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 10 * gib})
	g := startGate(t, sim.URL().String(), sim.GPU(), "-reserve", fmt.Sprint(8*gib))
	code, hdr, body := send(t, "POST", g.URL+"/api/generate", `{"model":"small","prompt":"hi"}`)
	r := readRefusal(t, code, hdr, body)
	found := false
	for _, b := range r.Blockers {
		found = found || b.Kind == "reserve" && b.Bytes == 8*gib
	}
	if r.Reason != "no room" || !found || !strings.Contains(r.Error, fmt.Sprint(uint64(8*gib))) {
		t.Fatalf("refusal %s; want reason no room, the reserve (8 GiB) named", body)
	}
	if sim.Requests("small") != 0 {
		t.Fatal("the refused load reached the server")
	}
}

// A check the gate could not make (Ollama failed /api/show, asked before a
// slot is made for the load) refuses the load with 503 and Retry-After,
// not 502.
func TestFailedCheckIsA503(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/ps", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"models":[{"name":"other:latest","model":"other:latest","size":1}]}`)
	})
	mux.HandleFunc("POST /api/show", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"disk on fire"}`, http.StatusInternalServerError)
	})
	up := httptest.NewServer(mux)
	t.Cleanup(up.Close)
	g := startGate(t, up.URL, nil, "-max-loaded", "1")
	code, hdr, body := send(t, "POST", g.URL+"/api/generate", `{"model":"tiny","prompt":"hi"}`)
	r := readRefusal(t, code, hdr, body)
	if r.Reason != "failed" || !strings.Contains(r.Error, "disk on fire") {
		t.Fatalf("refusal %s; want reason failed with Ollama's error", body)
	}
}

// Ollama's Go client keeps only the error text of a 503: the text says
// when to retry.
func TestRefusalTextForOllamasClient(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil, "-max-loaded", "1", "-retry-after", "7s")
	load(t, sim.APIClient(), "tiny")
	if code, _, body := send(t, "POST", g.URL+"/vramgate/leases", `{"model":"tiny","holder":"render-box","ttl":"90s"}`); code != 201 {
		t.Fatalf("lease: %d %s", code, body)
	}
	err := apiClient(t, g.URL).Generate(t.Context(), &api.GenerateRequest{Model: "small", Prompt: "hi"}, func(api.GenerateResponse) error { return nil })
	var se api.StatusError
	if !errors.As(err, &se) || se.StatusCode != 503 {
		t.Fatalf("Generate: %v, want a 503", err)
	}
	// The lease ends in at most 90 s: the retry is that, in whole seconds.
	if !strings.Contains(err.Error(), "render-box") || !strings.Contains(err.Error(), "retry after 9") && !strings.Contains(err.Error(), "retry after 8") {
		t.Fatalf("what Ollama's client shows: %q; want the lease's holder and when to retry (about 90 s)", err)
	}
}

// A lease's TTL is refused naming what the client sent, never a number
// the gate made up (1e12 seconds overflows a time.Duration).
func TestLeaseTTLMessages(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil)
	for _, tc := range []struct{ ttl, want string }{
		{`1e12`, `ttl 1e12 (seconds)`},
		{`-5`, `ttl -5 (seconds)`},
		{`"-5s"`, `ttl "-5s"`},
		{`"11m"`, `ttl "11m"`},
		{`1e999`, `ttl 1e999 (seconds)`},
		{`1e-12`, `ttl 1e-12 (seconds)`},
		{`"soon"`, `ttl "soon"`},
		{`true`, `ttl true`},
		{`9223372036854775807`, `ttl 9223372036854775807 (seconds)`},
		{`"2562048h"`, `ttl "2562048h"`},
	} {
		code, _, body := send(t, "POST", g.URL+"/vramgate/leases", `{"model":"tiny","holder":"h","ttl":`+tc.ttl+`}`)
		var e struct{ Error string }
		if err := json.Unmarshal([]byte(body), &e); err != nil || code != 400 || !strings.Contains(e.Error, tc.want+": ") || !strings.Contains(e.Error, "at most 10m0s") {
			t.Errorf("ttl %s: %d %s; want 400 naming %s and the bound", tc.ttl, code, body, tc.want)
		}
	}
	for _, ok := range []string{`90`, `"90s"`, `0.5`, `"10m"`} {
		code, _, body := send(t, "POST", g.URL+"/vramgate/leases", `{"model":"tiny","holder":"h","ttl":`+ok+`}`)
		if code != 201 {
			t.Errorf("ttl %s: %d %s, want 201", ok, code, body)
		}
	}
}

// parseTTL reads untrusted text: it never panics, and a TTL it accepts is
// more than 0 and at most the bound; one it refuses is named in the
// error as sent (up to its first 40 bytes).
func FuzzParseTTL(f *testing.F) {
	for _, s := range []string{`90`, `"90s"`, `1e12`, `-5`, `"-5s"`, `1e-12`, `null`, `true`, `"soon"`, `9223372036854775807`, `"2562048h"`, ``, `1e999`, `"\u0000"`} {
		f.Add(s)
	}
	const max = 10 * 60e9
	f.Fuzz(func(t *testing.T, raw string) {
		d, err := parseTTL(json.RawMessage(raw), max)
		switch {
		case err == nil && (d <= 0 || d > max):
			t.Fatalf("ttl %q accepted as %v", raw, d)
		case err != nil && d != 0:
			t.Fatalf("ttl %q refused with %v and a duration %v", raw, err, d)
		case err != nil && len(strings.TrimSpace(raw)) <= 40 && !strings.Contains(err.Error(), "ttl "+strings.TrimSpace(raw)):
			t.Fatalf("ttl %q refused without naming it: %v", raw, err)
		}
	})
}
