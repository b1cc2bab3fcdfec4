package reliability_test

import (
	"testing"

	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
	"go.uber.org/goleak"
)

// pool holds one real server per version for the whole package; TestMain
// stops them after the tests and then checks for leaked goroutines.
var pool = ollamatest.NewPool(ollamatest.Options{})

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(pool.Wrap(m))
}
