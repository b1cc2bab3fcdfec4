package vramguard_test

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if spec := os.Getenv("VRAMGUARD_LEASE_HOLDER"); spec != "" {
		leaseHolderMain(spec) // TestLeaseDiesWithItsProcess's second program; never returns
	}
	if spec := os.Getenv("VRAMGUARD_RESERVE_HOLDER"); spec != "" {
		reserveHolderMain(spec) // TestReservationDiesWithItsProcess's second program; never returns
	}
	// The host-wide lease directory of this test binary's clients that
	// name none is its own: go test runs other packages' tests beside it,
	// and a hand-over's reservation of theirs on a simulated device with
	// no UUID (which no reader can tell from this one's device 0) would be
	// honoured here. Second programs a test starts inherit it.
	dir, err := os.MkdirTemp("", "vramguard-test-runtime-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	os.Setenv("XDG_RUNTIME_DIR", dir)
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		os.RemoveAll(dir)
		os.Exit(code)
	}))
}
