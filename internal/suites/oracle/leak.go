package oracle

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strings"
	"time"
)

// labelKey is the profiler label that marks every goroutine a schedule's
// run started (goroutines inherit their creator's labels), so that a leak
// is found per schedule even while other schedules run beside it.
const labelKey = "oracle-schedule"

// Labeled runs fn with ctx labeled for the schedule run name.
func Labeled(ctx context.Context, name string, fn func(ctx context.Context)) {
	pprof.Do(ctx, pprof.Labels(labelKey, name), fn)
}

// Leaked waits up to limit for the goroutines labeled name to end and
// returns a description of those left ("" when none).
func Leaked(name string, limit time.Duration) string {
	want := fmt.Sprintf("%q:%q", labelKey, name)
	deadline := time.Now().Add(limit)
	for {
		var b bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		var left []string
		for _, group := range strings.Split(b.String(), "\n\n") {
			if strings.Contains(group, "# labels: {") && strings.Contains(group, want) {
				left = append(left, group)
			}
		}
		if len(left) == 0 {
			return ""
		}
		if time.Now().After(deadline) {
			return strings.Join(left, "\n\n")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
