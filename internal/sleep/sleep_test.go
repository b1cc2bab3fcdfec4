package sleep

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"
)

func TestCtx(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		if err := Ctx(t.Context(), time.Second); err != nil || time.Since(start) != time.Second {
			t.Errorf("a full sleep: %v after %v", err, time.Since(start))
		}
		cause := errors.New("stop")
		ctx, cancel := context.WithCancelCause(t.Context())
		time.AfterFunc(100*time.Millisecond, func() { cancel(cause) })
		start = time.Now()
		if err := Ctx(ctx, time.Hour); !errors.Is(err, cause) || time.Since(start) != 100*time.Millisecond {
			t.Errorf("a canceled sleep: %v after %v, want the cause after 100ms", err, time.Since(start))
		}
		if err := Ctx(ctx, 0); !errors.Is(err, cause) {
			t.Errorf("no sleep on a done context: %v, want the cause", err)
		}
		if err := Ctx(t.Context(), -time.Second); err != nil {
			t.Errorf("a negative sleep: %v", err)
		}
	})
}
