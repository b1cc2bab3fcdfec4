package vramguard_test

import (
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
	goleak.VerifyTestMain(m)
}
