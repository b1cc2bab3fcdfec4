//go:build go1.25

package vramguard

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// vramFakeReader answers Snapshot with fn(call number, time since start).
type vramFakeReader struct {
	mu    sync.Mutex
	start time.Time
	calls int
	fn    func(call int, since time.Duration) (*VRAMSnapshot, error)
}

func newVRAMFakeReader(fn func(call int, since time.Duration) (*VRAMSnapshot, error)) *vramFakeReader {
	return &vramFakeReader{start: time.Now(), fn: fn}
}

func (r *vramFakeReader) Snapshot(ctx context.Context) (*VRAMSnapshot, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	return r.fn(r.calls, time.Since(r.start))
}

func (r *vramFakeReader) Calls() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

const awaitGiB = 1 << 30

// awaitSnap is one 24 GiB device 0 with free bytes free, held by a runner
// and a diffusion process.
func awaitSnap(free uint64) *VRAMSnapshot {
	used := 24*awaitGiB - free
	return &VRAMSnapshot{Source: "simulated", Taken: time.Now(), Devices: []DeviceMemory{{
		Index: 0, Name: "Fake 4090", Total: 24 * awaitGiB, Free: free, Used: used, ProcessesKnown: true,
		Processes: []GPUProcess{
			{PID: 300, UsedBytes: 2 * awaitGiB, UsedKnown: true, Command: "/opt/ComfyUI/venv/bin/python main.py", Role: RoleOther},
			{PID: 200, UsedBytes: used - 2*awaitGiB, UsedKnown: true, Command: "/usr/local/bin/ollama runner --port 40000", Role: RoleOllamaRunner},
			{PID: 400, Role: RoleUnknown},
		},
	}}}
}

func TestAwaitFreeRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The runner exits at once, but the driver frees its memory 1 GiB
		// per second, as after an unload.
		r := newVRAMFakeReader(func(_ int, since time.Duration) (*VRAMSnapshot, error) {
			return awaitSnap(min(2*awaitGiB+uint64(since/time.Second)*awaitGiB, 24*awaitGiB)), nil
		})
		start := time.Now()
		snap, err := AwaitFree(t.Context(), r, AwaitRequest{Bytes: 8 * awaitGiB, Reserve: awaitGiB})
		if err != nil {
			t.Fatal(err)
		}
		if got := snap.Device(0).Free; got < 9*awaitGiB {
			t.Errorf("returned a snapshot with %d free", got)
		}
		if waited := time.Since(start); waited != 7*time.Second {
			t.Errorf("waited %v, want 7s", waited)
		}
		if n := r.Calls(); n != 29 { // at 0, 250ms, ..., 7s
			t.Errorf("%d snapshots, want 29", n)
		}
	})
}

func TestAwaitFreeImmediate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newVRAMFakeReader(func(int, time.Duration) (*VRAMSnapshot, error) { return awaitSnap(10 * awaitGiB), nil })
		if _, err := AwaitFree(t.Context(), r, AwaitRequest{Bytes: 10 * awaitGiB}); err != nil {
			t.Fatal(err)
		}
		if r.Calls() != 1 {
			t.Errorf("%d calls", r.Calls())
		}
	})
}

func TestAwaitFreeIntermittentErrors(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		flaky := errors.New("nvidia-smi: exit status 15")
		r := newVRAMFakeReader(func(call int, _ time.Duration) (*VRAMSnapshot, error) {
			switch {
			case call%2 == 0:
				return nil, flaky
			case call == 5:
				return nil, nil // a broken reader
			case call < 9:
				return awaitSnap(awaitGiB), nil
			default:
				return awaitSnap(12 * awaitGiB), nil
			}
		})
		start := time.Now()
		snap, err := AwaitFree(t.Context(), r, AwaitRequest{Bytes: 12 * awaitGiB, PollInterval: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if snap.Device(0).Free != 12*awaitGiB || time.Since(start) != 8*time.Second {
			t.Errorf("free %d after %v", snap.Device(0).Free, time.Since(start))
		}
	})
}

func TestAwaitFreeTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		flaky := errors.New("driver busy")
		r := newVRAMFakeReader(func(call int, _ time.Duration) (*VRAMSnapshot, error) {
			if call > 3 {
				return nil, flaky
			}
			return awaitSnap(3 * awaitGiB), nil
		})
		start := time.Now()
		snap, err := AwaitFree(t.Context(), r, AwaitRequest{Bytes: 8 * awaitGiB, Timeout: 2 * time.Second})
		if time.Since(start) != 2*time.Second {
			t.Errorf("returned after %v", time.Since(start))
		}
		if !errors.Is(err, KindTimeout) || KindOf(err) != KindTimeout {
			t.Fatalf("err = %v, want KindTimeout", err)
		}
		var ie *RoomError
		if !errors.As(err, &ie) {
			t.Fatalf("err = %v, no RoomError", err)
		}
		var e *Error
		if !errors.As(err, &e) || e.Op != "await free" {
			t.Errorf("err = %#v", e)
		}
		if snap == nil || ie.Free != 3*awaitGiB || ie.Need != 8*awaitGiB || ie.Total != 24*awaitGiB {
			t.Errorf("error fields: %+v", ie)
		}
		if !errors.Is(err, flaky) || !errors.Is(err, errAwaitTimeout) {
			t.Errorf("err = %v does not hold the last reader error and the timeout", err)
		}
		// Runners first, then other programs, each by memory; a process
		// whose memory is unknown is in the unattributed share.
		if len(ie.Holders) != 3 || ie.Holders[0].PID != 200 || ie.Holders[1].PID != 300 ||
			ie.Holders[2].Kind != HolderFree || ie.Holders[2].Bytes != 3*awaitGiB {
			t.Errorf("holders not sorted by memory: %+v", ie.Holders)
		}
		msg := err.Error()
		for _, want := range []string{
			"vramguard: await free: timeout: device 0 has 3.0 GiB free of 24.0 GiB, needs 8.0 GiB",
			`held by ollama runner (pid 200) 19.0 GiB`,
			`"/opt/ComfyUI/venv/bin/python main.py" (pid 300) 2.0 GiB`,
			"last reading failed: driver busy",
		} {
			if !strings.Contains(msg, want) {
				t.Errorf("message %q\nlacks %q", msg, want)
			}
		}
	})
}

func TestAwaitFreeCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newVRAMFakeReader(func(int, time.Duration) (*VRAMSnapshot, error) { return awaitSnap(awaitGiB), nil })
		cause := errors.New("workflow aborted")
		ctx, cancel := context.WithCancelCause(t.Context())
		time.AfterFunc(time.Second, func() { cancel(cause) })
		_, err := AwaitFree(ctx, r, AwaitRequest{Bytes: 8 * awaitGiB, Timeout: time.Hour})
		if !errors.Is(err, KindCanceled) || !errors.Is(err, cause) {
			t.Fatalf("err = %v, want KindCanceled with the cause", err)
		}
		var ie *RoomError
		if !errors.As(err, &ie) || ie.Err != cause {
			t.Errorf("err = %v", err)
		}

		// The caller's deadline is KindCanceled too: it is not our timeout.
		dctx, dcancel := context.WithTimeout(t.Context(), time.Second)
		defer dcancel()
		_, err = AwaitFree(dctx, r, AwaitRequest{Bytes: 8 * awaitGiB, Timeout: time.Hour})
		if !errors.Is(err, KindCanceled) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("caller deadline: %v", err)
		}

		// Already done: no snapshot is taken.
		n := r.Calls()
		if _, err := AwaitFree(ctx, r, AwaitRequest{}); !errors.Is(err, cause) || r.Calls() != n {
			t.Errorf("done ctx: %v after %d calls", err, r.Calls()-n)
		}
	})
}

func TestAwaitFreeNoReading(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		down := errors.New("no driver")
		r := newVRAMFakeReader(func(int, time.Duration) (*VRAMSnapshot, error) { return nil, down })
		snap, err := AwaitFree(t.Context(), r, AwaitRequest{Bytes: 1, Timeout: time.Second})
		if snap != nil || !errors.Is(err, KindTimeout) || !errors.Is(err, down) {
			t.Fatalf("AwaitFree = %v, %v", snap, err)
		}
		var ie *RoomError
		if errors.As(err, &ie) {
			t.Errorf("RoomError without a snapshot: %v", ie)
		}
		if !strings.Contains(err.Error(), "no reading of device 0") {
			t.Errorf("message %q", err)
		}
	})
}

func TestAwaitFreeProcessesUnknown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newVRAMFakeReader(func(int, time.Duration) (*VRAMSnapshot, error) {
			s := awaitSnap(awaitGiB)
			s.Devices[0].Processes, s.Devices[0].ProcessesKnown = nil, false
			return s, nil
		})
		_, err := AwaitFree(t.Context(), r, AwaitRequest{Bytes: 2 * awaitGiB, Timeout: time.Second})
		var ie *RoomError
		if !errors.As(err, &ie) || ie.Holders != nil || !strings.Contains(err.Error(), "processes unknown") {
			t.Errorf("err = %v", err)
		}
	})
}

func TestAwaitFreeValidation(t *testing.T) {
	good := newVRAMFakeReader(func(int, time.Duration) (*VRAMSnapshot, error) { return awaitSnap(awaitGiB), nil })
	noFigures := newVRAMFakeReader(func(int, time.Duration) (*VRAMSnapshot, error) {
		return &VRAMSnapshot{Source: "nvidia-smi", Devices: []DeviceMemory{{Index: 0}}}, nil
	})
	tests := []struct {
		name string
		r    VRAMReader
		req  AwaitRequest
		kind Kind
		msg  string
	}{
		{"nil reader", nil, AwaitRequest{}, KindInvalidInput, "nil VRAM reader"},
		{"negative poll interval", good, AwaitRequest{PollInterval: -time.Second}, KindInvalidInput, "poll interval"},
		{"negative timeout", good, AwaitRequest{Timeout: -1}, KindInvalidInput, "timeout"},
		{"negative device", good, AwaitRequest{Device: -1}, KindInvalidInput, "device"},
		{"absurd bytes", good, AwaitRequest{Bytes: MaxBytes + 1}, KindInvalidInput, "more than"},
		{"absurd reserve", good, AwaitRequest{Reserve: 1 << 63}, KindInvalidInput, "more than"},
		{"more than the device", good, AwaitRequest{Bytes: 20 * awaitGiB, Reserve: 5 * awaitGiB}, KindInvalidInput, "needs 25.0 GiB but device 0 has 24.0 GiB in total"},
		{"missing device", good, AwaitRequest{Device: 3}, KindNotFound, "no device 3"},
		{"no figures", noFigures, AwaitRequest{Bytes: 1}, KindUnavailable, "no memory figures"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := AwaitFree(t.Context(), tt.r, tt.req)
			if !errors.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("err = %v, want %v containing %q", err, tt.kind, tt.msg)
			}
		})
	}
}

func TestAttrDescribeHolder(t *testing.T) {
	tests := []struct {
		name string
		h    MemoryHolder
		want string
	}{
		{"unnamed runner", MemoryHolder{Kind: HolderRunner, Name: "pid 4242", PID: 4242, Bytes: 5 << 30},
			`ollama runner (pid 4242) 5.0 GiB`},
		{"named runner", MemoryHolder{Kind: HolderRunner, Name: "tiny-a", PID: 4242, Bytes: 5 << 30},
			`tiny-a (ollama runner, pid 4242) 5.0 GiB`},
		{"named orphan", MemoryHolder{Kind: HolderRunner, Name: "user/tiny:q4", PID: 4242, Bytes: 5 << 30, Orphaned: true},
			`user/tiny:q4 (ollama runner, pid 4242, orphaned) 5.0 GiB`},
		{"odd name from argv", MemoryHolder{Kind: HolderRunner, Name: "a b\n", PID: 4242, Bytes: 5 << 30},
			`"a b\n" (ollama runner, pid 4242) 5.0 GiB`},
		{"other", MemoryHolder{Kind: HolderOther, Name: "python main.py --listen", PID: 900, Bytes: 18 << 30},
			`"python main.py --listen" (pid 900) 18.0 GiB`},
		{"long command", MemoryHolder{Kind: HolderOther, Name: strings.Repeat("x", 70), PID: 1, Bytes: 1 << 20},
			`"` + strings.Repeat("x", 60) + `..." (pid 1) 1.0 MiB`},
		{"invisible process", MemoryHolder{Kind: HolderOther, Name: "pid 77", PID: 77, Bytes: 1 << 30}, `pid 77 1.0 GiB`},
		{"unattributed", MemoryHolder{Kind: HolderUnattributed, Bytes: 1 << 30},
			`unattributed 1.0 GiB (held by the driver or by processes it does not list with their memory)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := describeHolder(tt.h); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestAttrFormatBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1 << 20: "1.0 MiB", 5 << 29: "2.5 GiB"} {
		if got := vramFormatBytes(n); got != want {
			t.Errorf("vramFormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
