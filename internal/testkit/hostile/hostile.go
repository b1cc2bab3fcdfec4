// Package hostile runs the hostile-input tables of the module's public
// packages (the root, gpu, nodes): each call must return at once (or
// within its own timeouts), never panic, and fail only with a
// *vramguard.Error of an expected kind.
package hostile

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
)

// Bound is how long any hostile call may take (a 10 MB prompt on a busy
// machine under -race included).
const Bound = 20 * time.Second

// Case is one hostile call.
type Case struct {
	Name  string
	Call  func(ctx context.Context) error
	Kinds []vramguard.Kind // accepted kinds; KindUnknown: success accepted
}

// The usual sets of accepted kinds.
var (
	InvalidOnly     = []vramguard.Kind{vramguard.KindInvalidInput}
	CanceledOnly    = []vramguard.Kind{vramguard.KindCanceled}
	SuccessOnly     = []vramguard.Kind{vramguard.KindUnknown}
	NotFoundOnly    = []vramguard.Kind{vramguard.KindNotFound}
	UnavailableOnly = []vramguard.Kind{vramguard.KindUnavailable}
)

// Run runs tc.Call in a goroutine and checks the contract.
func Run(t *testing.T, ctx context.Context, tc Case) {
	t.Helper()
	type result struct {
		err      error
		panicked any
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		var r result
		defer func() {
			r.panicked = recover()
			done <- r
		}()
		r.err = tc.Call(ctx)
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(Bound):
		t.Fatalf("no result after %v: the call hangs", Bound)
	}
	if r.panicked != nil {
		t.Fatalf("panicked: %v", r.panicked)
	}
	d := time.Since(start)
	if r.err == nil {
		for _, k := range tc.Kinds {
			if k == vramguard.KindUnknown {
				return
			}
		}
		t.Fatalf("succeeded in %v; want an error of kind %v", d, tc.Kinds)
	}
	var e *vramguard.Error
	if !errors.As(r.err, &e) {
		t.Fatalf("untyped error %T: %v", r.err, r.err)
	}
	k := vramguard.KindOf(r.err)
	for _, want := range tc.Kinds {
		if k == want && k != vramguard.KindUnknown {
			return
		}
	}
	t.Fatalf("error %v: kind %v, want one of %v", r.err, k, tc.Kinds)
}
