package ollamatest_test

import (
	"os"
	"testing"

	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
)

// One server per version for the whole package, stopped after the tests.
var pool = ollamatest.NewPool(ollamatest.Options{})

// A TestMain for a package of integration tests:
//
//	func TestMain(m *testing.M) { os.Exit(pool.Run(m)) }
func ExamplePool() {
	_ = func(m *testing.M) { os.Exit(pool.Run(m)) }

	_ = func(t *testing.T) {
		for _, v := range ollamatest.Versions() {
			t.Run(v, func(t *testing.T) {
				s := pool.Require(t, v) // skips, or fails in CI, without a server
				if err := ollamatest.RegisterModels(t.Context(), s); err != nil {
					t.Fatal(err)
				}
				_ = s.Client() // talk to it with the real api.Client
			})
		}
	}
}

func ExampleRequire() {
	_ = func(t *testing.T) {
		s := ollamatest.Require(t, "0.17.4") // stopped by t.Cleanup
		pids, err := s.RunnerPIDs()
		if err != nil {
			t.Fatal(err)
		}
		_ = pids
	}
}
