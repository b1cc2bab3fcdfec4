//go:build linux

package handoff_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		childMain(role) // the orchestrator or the second program; never returns
	}
	goleak.VerifyTestMain(m)
}
