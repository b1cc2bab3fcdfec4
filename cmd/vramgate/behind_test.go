package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// behindGate is a vramguard client whose address is the gate at base, as
// a vramguard program with OLLAMA_HOST set to the gate has.
func behindGate(t *testing.T, base string) *vramguard.OllamaClient {
	t.Helper()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	c, err := vramguard.NewClient(vramguard.Options{Host: base, HTTPClient: &http.Client{Transport: tr}, PollInterval: 5 * time.Millisecond})
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

// A vramguard program behind the gate unloads a model while another
// program's load of it runs through the gate: the gate answers once that
// load ended and the model is verified gone, and the program's report
// says what the gate checked. In front of the test double the gate cannot
// see runners either, so the report says the verdict rests on /api/ps and
// why, naming the gate (and, through a second gate, both), never a bare
// ps-only "verified". With the runner check (a real server), the report
// names the gate as the one that made it: the integration suite's
// TestGateClientUnloadTakesTheGatesRunnerCheck.
func TestVramguardClientBehindTheGate(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{Version: "0.17.4", Models: []vramguardtest.ModelConfig{
		{Name: "tiny", Size: 2 * gib, Chunks: 2, LoadLatency: 300 * time.Millisecond},
	}})
	g1 := startGate(t, sim.URL().String(), nil)
	g2 := startGate(t, g1.URL, nil)
	host := func(g *running) string { return strings.TrimPrefix(g.URL, "http://") }
	tests := []struct {
		name string
		at   *running
		want string // the start of NoRunnerCheck
	}{
		{name: "one gate", at: g1, want: "vramgate at " + host(g1) + " made no runner check: no ollama serve process visible on this machine listens on port "},
		{name: "a gate in front of a gate", at: g2, want: "vramgate at " + host(g2) + " made no runner check: vramgate at " + host(g1) +
			" made no runner check: no ollama serve process visible on this machine listens on port "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := behindGate(t, tt.at.URL)
			before := sim.Requests("tiny")
			gen := make(chan error, 1)
			go func() {
				gen <- apiClient(t, tt.at.URL).Generate(context.Background(), &api.GenerateRequest{Model: "tiny", Prompt: "hi",
					KeepAlive: &api.Duration{Duration: 5 * time.Minute}}, func(api.GenerateResponse) error { return nil })
			}()
			for deadline := time.Now().Add(10 * time.Second); sim.Requests("tiny") == before; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the load did not reach the server")
				}
			}
			rep, err := c.UnloadModel(t.Context(), "tiny")
			if genErr := <-gen; genErr != nil {
				t.Logf("the other program's generation: %v", genErr)
			}
			if err != nil {
				t.Fatalf("UnloadModel behind the gate: %v", err)
			}
			t.Logf("report: checked %v, runner check by %q, no runner check %q", rep.Checked, rep.RunnerCheckBy, rep.NoRunnerCheck)
			if !rep.Verified || rep.Checked != vramguard.CheckPS || rep.RunnerCheckBy != "" || !strings.HasPrefix(rep.NoRunnerCheck, tt.want) {
				t.Errorf("report %+v; want verified by ps alone, NoRunnerCheck starting %q", rep, tt.want)
			}
			if sim.Listed("tiny") {
				t.Error("tiny is resident after the verified unload")
			}
		})
	}
}
