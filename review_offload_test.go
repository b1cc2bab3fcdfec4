package vramguard_test

import (
	"errors"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/sim"
	"github.com/vramguard/vramguard/internal/testkit/simvram"
)

// A chat refused by FailOnOffload must say it was a chat: every other
// failure of ChatStreaming has Op "chat", but failOffloaded hard-codes
// "generate".
func TestReviewChatFailOnOffloadOp(t *testing.T) {
	s := offloadSim(t, 7*gib, func(m *sim.ModelConfig) { m.Chunks, m.TokenLatency = 100, 5*time.Millisecond })
	c, _, _ := offloadClient(t, s, vramguard.Options{VRAM: &simvram.Reader{S: s}, FailOnOffload: true})
	_, err := c.ChatStreaming(t.Context(), &vramguard.ChatRequest{Model: "a", Messages: []api.Message{{Role: "user", Content: "x"}}},
		vramguard.KeepAliveFor(time.Hour), nil)
	var e *vramguard.Error
	if !errors.As(err, &e) || !errors.Is(err, vramguard.ErrOffloaded) {
		t.Fatalf("got %v, want ErrOffloaded", err)
	}
	if e.Op != "chat" {
		t.Errorf("Op = %q, want \"chat\" (err: %v)", e.Op, err)
	}
}
