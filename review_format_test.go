package vramguard

import (
	"encoding/json"
	"testing"

	"github.com/vramguard/vramguard/internal/testkit/sim"
)

// validFormat trims blanks and lets a blank Format through as "none",
// but the blank RawMessage is then sent as it is: json.Marshal refuses it,
// and the call fails after validation with a kind that is not
// KindInvalidInput (or, if accepted, must succeed like an empty Format).
func TestReviewBlankFormat(t *testing.T) {
	for _, ep := range endpoints() {
		t.Run(ep.name, func(t *testing.T) {
			s := newSim(t, sim.Config{}, sim.ModelConfig{Name: "tiny"})
			c := newTestClient(t, s, Options{})
			_, err := ep.run(t.Context(), c, &GenerateRequest{Model: "tiny", Prompt: "x", Format: json.RawMessage(" \n")}, KeepAliveUnload, nil)
			if err != nil {
				t.Fatalf("a blank Format passed validation (as none) and then failed: %v (kind %v)", err, KindOf(err))
			}
		})
	}
}
