package vramguard_test

import (
	"context"
	"net/http"
	"testing"

	. "github.com/vramguard/vramguard"

	"github.com/vramguard/vramguard/vramguardtest"
)

// BenchmarkUnloadIdle is a verified unload of a model that is not loaded,
// on the simulator (a local server, 127.0.0.1) with the default
// PollInterval: the fixed cost of UnloadModel when there is nothing to
// wait for. On a local server that includes the process check (an
// /api/show request, a procfs pass per poll) and the settle window
// (unloadSettle after the unload request).
func BenchmarkUnloadIdle(b *testing.B) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "tiny", Size: 1 << 30}}})
	defer s.Close()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	defer tr.CloseIdleConnections()
	c, err := NewClient(Options{Host: s.URL().String(), HTTPClient: &http.Client{Transport: tr}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	var polls int
	for b.Loop() {
		rep, err := c.UnloadModel(ctx, "tiny")
		if err != nil || !rep.Verified {
			b.Fatal(rep, err)
		}
		polls += rep.Polls
	}
	b.ReportMetric(float64(polls)/float64(b.N), "polls/op")
}
