// Package sleep waits for a duration or a context, whichever ends first:
// the one such helper of the module (the root package, the GPU check).
package sleep

import (
	"context"
	"time"
)

// Ctx sleeps for d or until ctx is done, and then returns
// context.Cause(ctx) (nil when the time passed first). A d of zero or less
// returns at once, with ctx's cause if it is already done.
func Ctx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
		return nil
	}
}
