package vramguard_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// twoGPUSim is one server spanning two 24 GiB devices (issue #34's first
// case): big (6 GiB) on GPU 0; small (4 GiB) on GPU 1 beside 18 GiB of
// comfyui; both loaded by another program. three (3 GiB) loads on GPU 1.
func twoGPUSim(t *testing.T, anonymous bool) (*vramguardtest.Server, *vramguardtest.MultiGPU) {
	t.Helper()
	s := newSim(t, vramguardtest.Config{TotalVRAM: 48 * gib},
		vramguardtest.ModelConfig{Name: "big", SizeVRAM: 6 * gib},
		vramguardtest.ModelConfig{Name: "small", SizeVRAM: 4 * gib},
		vramguardtest.ModelConfig{Name: "three", SizeVRAM: 3 * gib, LoadLatency: 20 * time.Millisecond})
	loadForever(t, s, "big", "small")
	if err := s.Reserve("python comfyui", 18*gib); err != nil {
		t.Fatal(err)
	}
	g := &vramguardtest.MultiGPU{Server: s, Totals: []uint64{24 * gib, 24 * gib}, Anonymous: anonymous,
		On: map[string]int{"small": 1, "three": 1, "python comfyui": 1}}
	return s, g
}

// TestRoomOnTheRightDevice: EnsureFree and a budget on device 1 evict the
// model on device 1 only, and succeed (before #34 EnsureFree evicted big,
// on device 0, and timed out; the budget waited past its timeouts).
func TestRoomOnTheRightDevice(t *testing.T) {
	t.Run("EnsureFree", func(t *testing.T) {
		s, g := twoGPUSim(t, false)
		c := newTestClient(t, s, vramguard.Options{VRAM: g})
		rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Device: 1, Bytes: 5 * gib, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatalf("EnsureFree(device 1, 5 GiB) = %v", err)
		}
		if len(rep.Evicted) != 1 || rep.Evicted[0].Model != "small:latest" || !rep.Evicted[0].Verified || rep.FreeAfter < 5*gib {
			t.Errorf("report %+v; want small evicted, verified, 5 GiB free", rep)
		}
		if !s.Listed("big") || s.Unloads("big") != 0 {
			t.Error("big, on device 0, was unloaded for a room on device 1")
		}
	})
	t.Run("budget", func(t *testing.T) {
		s, g := twoGPUSim(t, false)
		c := newTestClient(t, s, vramguard.Options{VRAM: g, Timeouts: vramguard.Timeouts{Total: 20 * time.Second},
			Budget: &vramguard.Budget{Device: 1, Headroom: gib, MakeRoom: true}})
		gen, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "three", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		if err != nil {
			t.Fatalf("a 3 GiB load on device 1: %v", err)
		}
		if !gen.Loaded || s.Loads("three") != 1 || s.Listed("small") || !s.Listed("big") {
			t.Errorf("loaded %v, small listed %v, big listed %v; want three loaded in small's place and big left", gen.Loaded, s.Listed("small"), s.Listed("big"))
		}
	})
}

// TestRoomRefusesToGuessDevice: a reader of two devices that names no
// runner's model keeps every model (ErrUnattributed) and unloads nothing;
// the same reader with one device counts size_vram and makes the room.
func TestRoomRefusesToGuessDevice(t *testing.T) {
	s, g := twoGPUSim(t, true)
	c := newTestClient(t, s, vramguard.Options{VRAM: g})
	rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Device: 1, Bytes: 5 * gib})
	var re *vramguard.RoomError
	if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.Is(err, vramguard.ErrUnattributed) || !errors.As(err, &re) {
		t.Fatalf("EnsureFree with an unattributing reader of two devices: %v; want KindOutOfMemory, ErrUnattributed", err)
	}
	if len(re.Kept) != 2 || !re.Kept[0].Unattributed || !re.Kept[1].Unattributed || len(rep.Evicted) != 0 {
		t.Errorf("kept %+v, evicted %+v; want both models kept unattributed, nothing evicted", re.Kept, rep.Evicted)
	}
	if !s.Listed("big") || !s.Listed("small") || !strings.Contains(err.Error(), "the reader cannot tell which device it is on") {
		t.Errorf("a model went, or the error %q does not say why", err)
	}

	one := &vramguardtest.MultiGPU{Server: s, Totals: []uint64{48 * gib}, Anonymous: true}
	c1 := newTestClient(t, s, vramguard.Options{VRAM: one})
	if err := s.Reserve("more", 17*gib); err != nil { // 48 - 6 - 4 - 18 - 17: 3 GiB free
		t.Fatal(err)
	}
	rep, err = c1.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 6 * gib, Timeout: 5 * time.Second})
	if err != nil || len(rep.Evicted) != 1 || rep.Evicted[0].Model != "small:latest" {
		t.Errorf("one device, no attribution: %+v, %v; want small (4 GiB by size_vram, the fewest bytes) evicted", rep, err)
	}
}

// vainSim: 3 GiB free of 24, a chat UI's 2 GiB model resident (another
// program's), comfyui holding the rest (issue #34's second case).
func vainSim(t *testing.T) *vramguardtest.Server {
	t.Helper()
	s := newSim(t, vramguardtest.Config{},
		vramguardtest.ModelConfig{Name: "chat", SizeVRAM: 2 * gib},
		vramguardtest.ModelConfig{Name: "two", SizeVRAM: 2 * gib})
	loadForever(t, s, "chat")
	if err := s.Reserve("comfyui", 19*gib); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestRoomRefusesInVain: when free memory plus every model it may evict
// cannot reach the need, EnsureFree and Budget.MakeRoom unload nothing
// and refuse at once, naming comfyui (before #34 both unloaded the chat
// UI's model, then failed).
func TestRoomRefusesInVain(t *testing.T) {
	check := func(t *testing.T, s *vramguardtest.Server, err error, requests int) {
		t.Helper()
		var re *vramguard.RoomError
		if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.As(err, &re) || re.Err != nil {
			t.Fatalf("err = %v; want KindOutOfMemory with a *RoomError refused by arithmetic (no wait)", err)
		}
		if !strings.Contains(err.Error(), `"comfyui"`) || re.Free != 3*gib {
			t.Errorf("refusal %q (free %d); want comfyui named and 3 GiB free", err, re.Free)
		}
		if !s.Listed("chat") || s.Requests("chat") != requests || s.Unloads("chat") != 0 {
			t.Errorf("the chat UI's model: listed %v, %d requests (want %d), %d unloads; want it left alone",
				s.Listed("chat"), s.Requests("chat"), requests, s.Unloads("chat"))
		}
	}
	t.Run("EnsureFree", func(t *testing.T) {
		s := vainSim(t)
		c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU()})
		rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 10 * gib})
		check(t, s, err, 1)
		if len(rep.Evicted) != 0 || len(rep.Plan) != 0 {
			t.Errorf("report %+v; want nothing evicted and no plan", rep)
		}
	})
	t.Run("budget", func(t *testing.T) {
		s := vainSim(t)
		c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{Headroom: 8 * gib, MakeRoom: true}})
		_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "two", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		check(t, s, err, 1)
		if !errors.Is(err, vramguard.ErrOverBudget) || s.Requests("two") != 0 {
			t.Errorf("err %v, %d requests for two; want ErrOverBudget and nothing sent", err, s.Requests("two"))
		}
	})
}

// TestRoomBoundedByCallTimeouts: a budget's room-making ends within the
// generation's own timeouts, as KindOutOfMemory naming the holders (before
// #34 it returned only when the caller's ctx ended, as KindCanceled).
func TestRoomBoundedByCallTimeouts(t *testing.T) {
	t.Run("nothing to evict", func(t *testing.T) {
		s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "tiny", SizeVRAM: gib})
		if err := s.Reserve("comfyui", 20*gib); err != nil {
			t.Fatal(err)
		}
		timeouts := vramguard.Timeouts{FirstChunk: time.Second, Total: 2 * time.Second}
		c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), Timeouts: timeouts,
			Budget: &vramguard.Budget{Headroom: 4 * gib, MakeRoom: true}})
		ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
		defer cancel()
		start := time.Now()
		_, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		var re *vramguard.RoomError
		if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.As(err, &re) || !strings.Contains(err.Error(), "comfyui") {
			t.Fatalf("err = %v; want KindOutOfMemory naming comfyui", err)
		}
		if took := time.Since(start); took >= timeouts.Total {
			t.Errorf("refused after %v; want within the generation's %v", took, timeouts.Total)
		}
	})
	t.Run("EnsureRequest.Timeout", func(t *testing.T) {
		s := newSim(t, vramguardtest.Config{ReleaseLag: time.Hour}, vramguardtest.ModelConfig{Name: "old", SizeVRAM: 6 * gib})
		loadForever(t, s, "old")
		if err := s.Reserve("comfyui", 16*gib); err != nil { // 2 GiB free
			t.Fatal(err)
		}
		c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond})
		const timeout = 200 * time.Millisecond
		rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 6 * gib, Timeout: timeout})
		var re *vramguard.RoomError
		if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &re) || re.Err == nil {
			t.Fatalf("EnsureFree = %v; want KindOutOfMemory whose cause matches context.DeadlineExceeded", err)
		}
		if !strings.Contains(err.Error(), "within 200ms (EnsureRequest.Timeout") || len(rep.Evicted) != 1 {
			t.Errorf("EnsureFree = %v, evicted %v; want old evicted and the bound named", err, rep.Evicted)
		}
	})
	t.Run("the driver never shows the room", func(t *testing.T) {
		// The runner leaves /api/ps but its memory stays for an hour.
		s := newSim(t, vramguardtest.Config{ReleaseLag: time.Hour},
			vramguardtest.ModelConfig{Name: "old", SizeVRAM: 6 * gib}, vramguardtest.ModelConfig{Name: "tiny", SizeVRAM: 2 * gib})
		loadForever(t, s, "old")
		if err := s.Reserve("comfyui", 16*gib); err != nil { // 2 GiB free
			t.Fatal(err)
		}
		timeouts := vramguard.Timeouts{FirstChunk: 500 * time.Millisecond, Total: 10 * time.Second}
		c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), Timeouts: timeouts, VRAMPollInterval: 20 * time.Millisecond,
			Budget: &vramguard.Budget{Headroom: 2 * gib, MakeRoom: true}})
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		start := time.Now()
		_, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		took := time.Since(start)
		var re *vramguard.RoomError
		if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.Is(err, vramguard.ErrFirstChunkTimeout) || !errors.As(err, &re) {
			t.Fatalf("err = %v; want KindOutOfMemory with the first-chunk timeout as its cause", err)
		}
		if !strings.Contains(err.Error(), "comfyui") || re.Err == nil || s.Listed("old") {
			t.Errorf("err %v; want comfyui named, the wait's end, and old unloaded (verified from /api/ps)", err)
		}
		// Bounded by FirstChunk, which the test controls (the ctx has 30 s).
		if took >= timeouts.Total {
			t.Errorf("returned after %v; want within FirstChunk (%v) and well before Total", took, timeouts.FirstChunk)
		}
		if s.Requests("tiny") != 0 {
			t.Error("the refused load reached the server")
		}
	})
}

// TestEnsureFreeDryRun: a dry run names what it would unload and what
// it keeps, and when the lease that keeps ends, and sends nothing; one
// that cannot make the room is the refusal the real call would give.
func TestEnsureFreeDryRun(t *testing.T) {
	s, _ := gpuSim(t, vramguardtest.Config{}, vramguard.Options{})
	dir := leaseDir(t)
	holder := newTestClient(t, s, vramguard.Options{Leases: vramguard.LeaseOptions{Dir: dir}})
	_ = holder
	if _, err := holder.HoldModel(t.Context(), "mid", time.Hour); err != nil {
		t.Fatal(err)
	}
	dry := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), Leases: vramguard.LeaseOptions{Dir: dir}})
	if err := s.Reserve("comfyui", 6*gib); err != nil { // 2 GiB free
		t.Fatal(err)
	}
	before := s.Stats("").Requests
	rep, err := dry.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 11_200_000_000, DryRun: true})
	if err != nil {
		t.Fatalf("dry run: %v", err)
	}
	if fmt.Sprint(rep.Plan) != "[big:latest small:latest]" || len(rep.Evicted) != 0 {
		t.Errorf("plan %v, evicted %v; want big and small (10 GiB, mid leased), nothing evicted", rep.Plan, rep.Evicted)
	}
	if len(rep.Kept) != 1 || rep.Kept[0].Model != "mid:latest" || len(rep.Kept[0].Leases) != 1 || rep.RetryAfter < 59*time.Minute {
		t.Errorf("kept %+v, retry after %v; want mid leased for an hour", rep.Kept, rep.RetryAfter)
	}
	_, err = dry.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 20 * gib, DryRun: true})
	var re *vramguard.RoomError
	if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.As(err, &re) || !errors.Is(err, vramguard.ErrLeased) {
		t.Errorf("a dry run that cannot: %v; want the refusal, naming the lease", err)
	}
	if n := s.Stats("").Requests - before; n != 0 || !s.Listed("big") || !s.Listed("small") || !s.Listed("mid") {
		t.Errorf("dry runs sent %d requests; want none, every model left", n)
	}
}

// tenantSim: big (8 GiB, another program's) and two tenants' memory
// (a: 4 GiB, b: 6 GiB) on one 24 GiB device: 6 GiB free.
func tenantSim(t *testing.T) *vramguardtest.Server {
	t.Helper()
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "big", SizeVRAM: 8 * gib})
	loadForever(t, s, "big")
	for o, b := range map[string]uint64{"a": 4 * gib, "b": 6 * gib} {
		if err := s.Reserve(o, b); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// order records the steps of room-making: tenants' releases and unloads.
type order struct {
	mu    sync.Mutex
	steps []string
}

func (o *order) add(s string) { o.mu.Lock(); o.steps = append(o.steps, s); o.mu.Unlock() }
func (o *order) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return strings.Join(o.steps, " ")
}

// TestTenantsInOrderVerified: room-making asks tenants with First before
// Ollama's models, the others after, each only while the room is still
// missing, and verifies each release on the device.
func TestTenantsInOrderVerified(t *testing.T) {
	releasing := func(s *vramguardtest.Server, o *order, owner string) func(context.Context) error {
		return func(context.Context) error { o.add(owner); s.Release(owner); return nil }
	}
	tests := []struct {
		name    string
		need    uint64
		tenants func(s *vramguardtest.Server, o *order) []vramguard.Tenant
		want    string // the steps
		err     bool
	}{
		{name: "models before other tenants", need: 12 * gib, want: "big:latest",
			tenants: func(s *vramguardtest.Server, o *order) []vramguard.Tenant {
				return []vramguard.Tenant{{Name: "b", Bytes: 6 * gib, Release: releasing(s, o, "b")}}
			}},
		{name: "first tenant spares the model", need: 12 * gib, want: "b",
			tenants: func(s *vramguardtest.Server, o *order) []vramguard.Tenant {
				return []vramguard.Tenant{{Name: "b", Bytes: 6 * gib, First: true, Release: releasing(s, o, "b")}}
			}},
		{name: "first, models, then the others", need: 20 * gib, want: "a big:latest b",
			tenants: func(s *vramguardtest.Server, o *order) []vramguard.Tenant {
				return []vramguard.Tenant{{Name: "b", Bytes: 6 * gib, Release: releasing(s, o, "b")},
					{Name: "a", Bytes: 4 * gib, First: true, Release: releasing(s, o, "a")}}
			}},
		{name: "size from its process", need: 20 * gib, want: "big:latest b",
			tenants: func(s *vramguardtest.Server, o *order) []vramguard.Tenant {
				return []vramguard.Tenant{{Name: "b", PID: pidOf(t, s, "b"), Release: releasing(s, o, "b")}}
			}},
		{name: "unknown size: tried, not refused", need: 20 * gib, want: "big:latest b",
			tenants: func(s *vramguardtest.Server, o *order) []vramguard.Tenant {
				return []vramguard.Tenant{{Name: "b", Release: releasing(s, o, "b")}}
			}},
		{name: "a tenant that gives nothing back is not verified", need: 12 * gib, want: "liar big:latest",
			tenants: func(s *vramguardtest.Server, o *order) []vramguard.Tenant {
				return []vramguard.Tenant{{Name: "liar", Bytes: 6 * gib, First: true, Release: func(context.Context) error { o.add("liar"); return nil }}}
			}},
		// b says 20 GiB but holds 6: the wait for its memory is for the
		// room (12 GiB), not for 26 GiB of a 24 GiB device.
		{name: "a tenant that overstates its bytes", need: 12 * gib, want: "b",
			tenants: func(s *vramguardtest.Server, o *order) []vramguard.Tenant {
				return []vramguard.Tenant{{Name: "b", Bytes: 20 * gib, First: true, Release: releasing(s, o, "b")}}
			}},
		{name: "arithmetic counts known tenants", need: 23 * gib, want: "", err: true,
			tenants: func(s *vramguardtest.Server, o *order) []vramguard.Tenant {
				return []vramguard.Tenant{{Name: "b", Bytes: 6 * gib, Release: releasing(s, o, "b")}}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tenantSim(t)
			o := &order{}
			c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond,
				Hooks: vramguard.Hooks{OnUnloadStart: func(ctx context.Context, u vramguard.UnloadStart) context.Context {
					o.add(u.Model)
					return ctx
				}}})
			for _, tn := range tt.tenants(s, o) {
				if _, err := c.RegisterTenant(tn); err != nil {
					t.Fatal(err)
				}
			}
			rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: tt.need, Timeout: 300 * time.Millisecond})
			if tt.err != (err != nil) {
				t.Fatalf("EnsureFree = %v (report %+v); want an error: %v", err, rep, tt.err)
			}
			if o.String() != tt.want {
				t.Errorf("steps %q, want %q", o, tt.want)
			}
			for _, tr := range rep.Tenants {
				if got, want := tr.Verified, tr.Name != "liar"; got != want || (want && tr.FreeAfter <= tr.FreeBefore) {
					t.Errorf("tenant %+v: verified %v, want %v", tr, got, want)
				}
			}
			if err == nil {
				if _, _, f := s.Memory(); f < tt.need {
					t.Errorf("%d bytes free after EnsureFree, want %d", f, tt.need)
				}
			}
		})
	}
	nop := func(context.Context) error { return nil }
	c := newTestClient(t, tenantSim(t), vramguard.Options{})
	if _, err := c.RegisterTenant(vramguard.Tenant{Name: "taken", Release: nop}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []vramguard.Tenant{{Name: "no release"}, {Release: nop}, {Name: "taken", Release: nop},
		{Name: "below -1", Device: -2, Release: nop}, {Name: "huge", Bytes: vramguard.MaxBytes + 1, Release: nop}} {
		if _, err := c.RegisterTenant(bad); !errors.Is(err, vramguard.KindInvalidInput) {
			t.Errorf("RegisterTenant(%+v) = %v; want KindInvalidInput", bad.Name, err)
		}
	}
	closed, err := vramguard.NewClient(vramguard.Options{Host: "127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	_ = closed.Close()
	if _, err := closed.RegisterTenant(vramguard.Tenant{Name: "late", Release: nop}); !errors.Is(err, vramguard.ErrClosed) {
		t.Errorf("RegisterTenant on a closed client = %v; want ErrClosed", err)
	}
}

// TestTenantReleaseFails: a release that fails is reported, not waited
// for, and the room is made by the next step; the call's kind is the
// outcome's.
func TestTenantReleaseFails(t *testing.T) {
	s := tenantSim(t)
	c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond})
	boom := errors.New("cuda: device busy")
	if _, err := c.RegisterTenant(vramguard.Tenant{Name: "broken", Bytes: 6 * gib, First: true, Release: func(context.Context) error { return boom }}); err != nil {
		t.Fatal(err)
	}
	const timeout = 5 * time.Second
	rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 12 * gib, Timeout: timeout})
	if !errors.Is(err, boom) || vramguard.KindOf(err) != vramguard.KindInternal || len(rep.Tenants) != 1 || rep.Tenants[0].Verified {
		t.Errorf("EnsureFree = %v (kind %v), tenants %+v; want the release's failure reported, unverified", err, vramguard.KindOf(err), rep.Tenants)
	}
	if len(rep.Evicted) != 1 || rep.Elapsed >= timeout || rep.FreeAfter < 12*gib {
		t.Errorf("report %+v; want big evicted in its place, without waiting %v for the failed release", rep, timeout)
	}
	// Now nothing can make the room: the outcome comes first.
	if _, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 20 * gib, Timeout: 200 * time.Millisecond}); vramguard.KindOf(err) != vramguard.KindOutOfMemory {
		t.Errorf("EnsureFree(20 GiB) = %v (kind %v); want KindOutOfMemory", err, vramguard.KindOf(err))
	}
}

// busyErr is a tenant's own error around its ctx's cause.
type busyErr struct{ err error }

func (e busyErr) Error() string { return "busy: " + e.err.Error() }
func (e busyErr) Unwrap() error { return e.err }

// TestTenantReleaseBoundedByTimeout: a tenant whose Release waits (for
// its own work, say) is bounded by EnsureRequest.Timeout, not only by the
// caller's ctx; when the bound ends the room it could not make is the
// *RoomError of KindTimeout, with context.DeadlineExceeded in its chain
// and the release's own error kept (issue #46: it was KindInternal after
// the caller's whole ctx).
func TestTenantReleaseBoundedByTimeout(t *testing.T) {
	s := tenantSim(t)
	c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond})
	if _, err := c.RegisterTenant(vramguard.Tenant{Name: "render", Bytes: 6 * gib, First: true, Release: func(ctx context.Context) error {
		<-ctx.Done()
		return &vramguard.Error{Op: "render", Kind: vramguard.KindTimeout, Err: busyErr{context.Cause(ctx)}}
	}}); err != nil {
		t.Fatal(err)
	}
	const timeout = 300 * time.Millisecond
	rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 20 * gib, Timeout: timeout})
	var re *vramguard.RoomError
	var be busyErr
	if !errors.As(err, &re) || vramguard.KindOf(err) != vramguard.KindTimeout || !errors.Is(err, context.DeadlineExceeded) || !errors.As(err, &be) {
		t.Errorf("EnsureFree = %v (kind %v); want a *RoomError of KindTimeout, DeadlineExceeded and the release's error in its chain", err, vramguard.KindOf(err))
	}
	if len(rep.Tenants) != 1 || rep.Tenants[0].Elapsed < timeout || rep.Tenants[0].Elapsed > 20*timeout {
		t.Errorf("tenants %+v; want the release ended by the %v timeout", rep.Tenants, timeout)
	}
}

// TestTenantSize: a tenant's Size, asked at each plan, overrides Bytes
// for the arithmetic; one that fails, panics or says more than MaxBytes
// leaves the size unknown (tried, not refused) and breaks nothing.
func TestTenantSize(t *testing.T) {
	tests := []struct {
		name  string
		size  func(context.Context) (uint64, error)
		want  string // the steps
		err   bool
		asked bool
	}{
		{name: "no Size: Bytes counts, refused by arithmetic", want: "", err: true},
		{name: "Size counts", size: func(context.Context) (uint64, error) { return 6 * gib, nil }, want: "big:latest b", asked: true},
		{name: "Size fails: unknown", size: func(context.Context) (uint64, error) { return 0, errors.New("stats slow") }, want: "big:latest b", asked: true},
		{name: "Size panics: unknown", size: func(context.Context) (uint64, error) { panic("boom") }, want: "big:latest b", asked: true},
		{name: "Size says too much: unknown", size: func(context.Context) (uint64, error) { return vramguard.MaxBytes + 1, nil }, want: "big:latest b", asked: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := tenantSim(t) // 6 GiB free, big 8, b 6: 18 GiB needs b's 6, Bytes says 1
			o := &order{}
			c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond,
				Hooks: vramguard.Hooks{OnUnloadStart: func(ctx context.Context, u vramguard.UnloadStart) context.Context {
					o.add(u.Model)
					return ctx
				}}})
			var asked atomic.Bool
			tn := vramguard.Tenant{Name: "b", Bytes: gib, Release: func(context.Context) error { o.add("b"); s.Release("b"); return nil }}
			if tt.size != nil {
				tn.Size = func(ctx context.Context) (uint64, error) { asked.Store(true); return tt.size(ctx) }
			}
			if _, err := c.RegisterTenant(tn); err != nil {
				t.Fatal(err)
			}
			rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 18 * gib, Timeout: 2 * time.Second})
			if tt.err != (err != nil) || (err != nil && vramguard.KindOf(err) != vramguard.KindOutOfMemory) {
				t.Fatalf("EnsureFree = %v (report %+v); want an error of KindOutOfMemory: %v", err, rep, tt.err)
			}
			if o.String() != tt.want || asked.Load() != tt.asked {
				t.Errorf("steps %q, Size asked %v; want %q, %v", o, asked.Load(), tt.want, tt.asked)
			}
		})
	}
}

// retryIn is a refusal that says when to try again.
type retryIn time.Duration

func (r retryIn) Error() string             { return "rendering" }
func (r retryIn) RetryAfter() time.Duration { return time.Duration(r) }
func refusing(d time.Duration) func(context.Context) error {
	return func(context.Context) error {
		return &vramguard.Error{Op: "release", Kind: vramguard.KindRefused, Err: retryIn(d)}
	}
}

// TestTenantRefuses: a tenant that refuses (KindRefused) is not waited
// for: when the rest of the plan makes the room it is made; when it does
// not, room-making ends at once with the *RoomError, its RetryAfter the
// refusal's; and a budget's load is refused the same way.
func TestTenantRefuses(t *testing.T) {
	const timeout = 10 * time.Second
	t.Run("the rest makes the room", func(t *testing.T) {
		s := tenantSim(t)
		c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond})
		if _, err := c.RegisterTenant(vramguard.Tenant{Name: "render", Bytes: 6 * gib, First: true, Release: refusing(3 * time.Second)}); err != nil {
			t.Fatal(err)
		}
		rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 12 * gib, Timeout: timeout})
		if !errors.Is(err, vramguard.KindRefused) || len(rep.Evicted) != 1 || rep.FreeAfter < 12*gib {
			t.Errorf("EnsureFree = %v, report %+v; want the refusal reported and big evicted for the room", err, rep)
		}
	})
	t.Run("refused at once", func(t *testing.T) {
		s := tenantSim(t)
		c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond})
		if _, err := c.RegisterTenant(vramguard.Tenant{Name: "render", Bytes: 6 * gib, First: true, Release: refusing(3 * time.Second)}); err != nil {
			t.Fatal(err)
		}
		rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 20 * gib, Timeout: timeout})
		var re *vramguard.RoomError
		if !errors.As(err, &re) || vramguard.KindOf(err) != vramguard.KindOutOfMemory || !errors.Is(err, vramguard.KindRefused) {
			t.Fatalf("EnsureFree = %v; want KindOutOfMemory with a *RoomError and the refusal", err)
		}
		if re.RetryAfter < 3*time.Second || rep.Elapsed >= timeout/2 || len(re.Holders) == 0 {
			t.Errorf("RoomError %+v after %v; want RetryAfter >= 3s, no wait for the %v timeout, the holders named", re, rep.Elapsed, timeout)
		}
	})
	t.Run("a budget's load", func(t *testing.T) {
		s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "next", SizeVRAM: 8 * gib})
		if err := s.Reserve("render", 20*gib); err != nil {
			t.Fatal(err)
		}
		c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond,
			Budget: &vramguard.Budget{MakeRoom: true}, Timeouts: vramguard.Timeouts{FirstChunk: timeout}})
		if _, err := c.RegisterTenant(vramguard.Tenant{Name: "render", Bytes: 20 * gib, Release: refusing(2 * time.Second)}); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "next", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		var re *vramguard.RoomError
		if !errors.As(err, &re) || re.Budget == nil || re.RetryAfter < 2*time.Second || time.Since(start) >= timeout/2 || s.Listed("next") {
			t.Errorf("GenerateStreaming = %v (%+v) after %v; want the load refused at once with RetryAfter >= 2s, nothing loaded", err, re, time.Since(start))
		}
	})
}

// pidOf is the fake PID of owner's reservation on s.
func pidOf(t *testing.T, s *vramguardtest.Server, owner string) uint32 {
	t.Helper()
	i := slices.IndexFunc(s.Holders(), func(h vramguardtest.Holder) bool { return h.Name == owner && !h.Runner })
	if i < 0 {
		t.Fatalf("no reservation of %s", owner)
	}
	return s.Holders()[i].PID
}

// TestRoomRunnerNotListed: a runner the device shows and /api/ps does not
// list is leaving (its memory comes back: the room is waited for, not
// refused) or loading (the refusal comes after the call's own Timeout).
func TestRoomRunnerNotListed(t *testing.T) {
	t.Run("leaving", func(t *testing.T) {
		s := newSim(t, vramguardtest.Config{ReleaseLag: 300 * time.Millisecond}, vramguardtest.ModelConfig{Name: "old", SizeVRAM: 6 * gib})
		loadForever(t, s, "old")
		if err := s.Reserve("comfyui", 16*gib); err != nil {
			t.Fatal(err)
		}
		c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond})
		other := newTestClient(t, s, vramguard.Options{})
		if _, err := other.UnloadModel(t.Context(), "old"); err != nil {
			t.Fatal(err)
		}
		if _, _, f := s.Memory(); f >= 6*gib {
			t.Fatalf("%d bytes free right after the unload; the test needs the driver's lag", f)
		}
		rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 6 * gib, Timeout: 10 * time.Second})
		if err != nil || len(rep.Evicted) != 0 || rep.FreeAfter < 6*gib {
			t.Errorf("EnsureFree while old's memory comes back: %+v, %v; want the room, nothing evicted", rep, err)
		}
	})
	t.Run("loading", func(t *testing.T) {
		s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "slow", SizeVRAM: 6 * gib, LoadLatency: time.Hour})
		if err := s.Reserve("comfyui", 16*gib); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		done := make(chan struct{})
		go func() { defer close(done); _ = generateRaw(ctx, s, "slow") }()
		t.Cleanup(func() { cancel(); <-done })
		eventually(t, s, "slow loading", func() bool { _, _, f := s.Memory(); return f < 6*gib })
		c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond})
		const timeout = 300 * time.Millisecond
		start := time.Now()
		_, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 6 * gib, Timeout: timeout})
		took := time.Since(start)
		if !errors.Is(err, vramguard.KindOutOfMemory) || took < timeout || took > 10*timeout {
			t.Errorf("EnsureFree beside a loading runner: %v after %v; want KindOutOfMemory after about %v", err, took, timeout)
		}
	})
}

// generateRaw sends a generation as another program would, and waits for
// its end.
func generateRaw(ctx context.Context, s *vramguardtest.Server, model string) error {
	return s.APIClient().Generate(ctx, &api.GenerateRequest{Model: model, Prompt: "x"}, func(api.GenerateResponse) error { return nil })
}

// TestBudgetAsksTenants: features in pairs. A budget's MakeRoom asks a
// tenant beside another program's model, in the documented order: with
// First the tenant gives the room and the model stays; without it the
// model goes first and the tenant is not asked. Either way the load is
// admitted and verified on the device.
func TestBudgetAsksTenants(t *testing.T) {
	for _, first := range []bool{true, false} {
		t.Run(fmt.Sprintf("First=%v", first), func(t *testing.T) {
			s := newSim(t, vramguardtest.Config{},
				vramguardtest.ModelConfig{Name: "other", SizeVRAM: 8 * gib},
				vramguardtest.ModelConfig{Name: "next", SizeVRAM: 4 * gib, LoadLatency: 20 * time.Millisecond})
			loadForever(t, s, "other")
			if err := s.Reserve("comfyui", 14*gib); err != nil { // 2 GiB free
				t.Fatal(err)
			}
			c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond,
				Budget: &vramguard.Budget{Headroom: gib, MakeRoom: true}})
			asked := 0
			if _, err := c.RegisterTenant(vramguard.Tenant{Name: "comfyui", Bytes: 14 * gib, First: first,
				Release: func(context.Context) error { asked++; s.Release("comfyui"); return nil }}); err != nil {
				t.Fatal(err)
			}
			gen, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "next", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
			if err != nil || !gen.Loaded {
				t.Fatalf("GenerateStreaming = %v; want next admitted and loaded", err)
			}
			wantAsked, wantOther := 0, false
			if first {
				wantAsked, wantOther = 1, true
			}
			if asked != wantAsked || s.Listed("other") != wantOther {
				t.Errorf("tenant asked %d times, other listed %v; want %d, %v", asked, s.Listed("other"), wantAsked, wantOther)
			}
		})
	}
}

// EnsureRequest.KeepInUse keeps a model a generation of this client runs
// on, and KeepOwn the models this client's own leases hold (named with
// their lease, ErrLeased); without them EnsureFree takes both, last.
func TestEnsureFreeKeepInUseAndKeepOwn(t *testing.T) {
	s := newSim(t, vramguardtest.Config{TotalVRAM: 10 * gib, StrictVRAM: true},
		vramguardtest.ModelConfig{Name: "busy", SizeVRAM: 3 * gib, TokenLatency: 20 * time.Millisecond, Chunks: 10000},
		vramguardtest.ModelConfig{Name: "held", SizeVRAM: 3 * gib})
	c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), Leases: vramguard.LeaseOptions{Dir: leaseDir(t)}})
	if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "held", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	l, err := c.HoldModel(t.Context(), "held", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	ctx, cancel := context.WithCancel(t.Context())
	started := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		var once sync.Once
		_, _ = c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "busy", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour),
			func(vramguard.Chunk) error { once.Do(func() { close(started) }); return nil })
	}()
	defer func() { cancel(); <-done }()
	<-started
	req := vramguard.EnsureRequest{Bytes: 9 * gib, DryRun: true} // 4 GiB free: both must go
	rep, err := c.EnsureFree(t.Context(), req)
	if err != nil || !slices.Equal(rep.Plan, []string{"held:latest", "busy:latest"}) {
		t.Fatalf("dry run = %+v, %v; want both planned, the leased one first and the busy one last", rep, err)
	}
	req.KeepInUse = true
	_, err = c.EnsureFree(t.Context(), req)
	var re *vramguard.RoomError
	if !errors.As(err, &re) || len(re.Kept) != 1 || re.Kept[0].Model != "busy:latest" || !re.Kept[0].InUse {
		t.Errorf("KeepInUse = %v; want a refusal keeping busy (in use)", err)
	}
	req.KeepInUse, req.KeepOwn = false, true
	_, err = c.EnsureFree(t.Context(), req)
	if !errors.As(err, &re) || !errors.Is(err, vramguard.ErrLeased) || len(re.Kept) != 1 || re.Kept[0].Model != "held:latest" || len(re.Kept[0].Leases) != 1 {
		t.Errorf("KeepOwn = %v; want a refusal keeping held by this client's lease", err)
	}
}

// A CPU server lists every model with size_vram 0. EnsureFree with
// AllModels (the only way without a VRAM reader) still keeps what the
// rules keep: another program's leased model, a protected one. It once
// planned to unload both, the leased one included, because room-making on
// a device skips models that hold nothing on it before it reads the rules
// (vramgate's slots found it on every real server).
func TestEnsureFreeAllModelsOnCPU(t *testing.T) {
	ps := `{"models":[` +
		`{"name":"leased:latest","model":"leased:latest","size":100,"size_vram":0,"expires_at":"2099-01-01T00:00:00Z"},` +
		`{"name":"kept:latest","model":"kept:latest","size":100,"size_vram":0,"expires_at":"2099-01-01T00:00:00Z"},` +
		`{"name":"idle:latest","model":"idle:latest","size":100,"size_vram":0,"expires_at":"2099-01-01T00:00:00Z"}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/ps" {
			http.Error(w, "not here", http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, ps)
	}))
	defer srv.Close()
	dir := leaseDir(t)
	other, err := vramguard.NewClient(vramguard.Options{Host: srv.URL, Leases: vramguard.LeaseOptions{Dir: dir}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	l, err := other.HoldModel(t.Context(), "leased", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	c, err := vramguard.NewClient(vramguard.Options{Host: srv.URL, Leases: vramguard.LeaseOptions{Dir: dir}, Protected: []string{"kept"},
		KeepModelsOnClose: true})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{AllModels: true, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(rep.Plan, []string{"idle:latest"}) {
		t.Fatalf("plan %v, want [idle:latest]: the leased and the protected model are kept", rep.Plan)
	}
	kept := map[string]vramguard.KeptModel{}
	for _, k := range rep.Kept {
		kept[k.Model] = k
	}
	if k := kept["leased:latest"]; len(k.Leases) != 1 || k.SizeVRAM != 0 {
		t.Errorf("leased model kept as %+v, want its lease and size_vram 0", k)
	}
	if k := kept["kept:latest"]; !k.Protected {
		t.Errorf("protected model kept as %+v", k)
	}
}

// A plan whose later step another holder's lease rules out, after its
// first step ran, is planned again as at the start: refused at once,
// naming the lease, rather than after waiting out the bound for memory
// nothing frees; with WaitForLeases it waits for the lease instead, and
// makes the room once it ends (composition oracle seed
// 1796442412968310332). The first step is a tenant's release, in which the
// other client leases the model the second step counted on.
func TestRoomPlannedAgainWhenALeaseComesBetweenSteps(t *testing.T) {
	for _, wait := range []bool{false, true} {
		t.Run(fmt.Sprintf("WaitForLeases=%v", wait), func(t *testing.T) {
			s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
			if err := s.Reserve("desktop", 14*gib); err != nil {
				t.Fatal(err)
			}
			if err := s.Reserve("comfy", 2*gib); err != nil {
				t.Fatal(err)
			}
			dir := leaseDir(t)
			gpu := &vramguardtest.GPU{Server: s}
			maker := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
			other := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
			warmModel(t, maker, "mid") // 6 GiB; 2 GiB free of 24
			own, err := maker.HoldModel(t.Context(), "mid", 0)
			if err != nil {
				t.Fatal(err)
			}
			defer own.Release()
			var leased *vramguard.Lease
			var lerr error
			unregister, err := maker.RegisterTenant(vramguard.Tenant{Name: "comfy", Bytes: 2 * gib, First: true, Release: func(ctx context.Context) error {
				s.Release("comfy")
				leased, lerr = other.HoldModel(ctx, "mid", 300*time.Millisecond)
				return nil
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer unregister()
			// 2 free + comfy's 2 + mid's 6 make the 10 GiB: comfy first,
			// then mid, this client's own leased model.
			rep, err := maker.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 10 * gib, Timeout: 10 * time.Second, WaitForLeases: wait})
			if lerr != nil {
				t.Fatal(lerr)
			}
			defer leased.Release()
			if rep == nil || len(rep.Tenants) != 1 {
				t.Fatalf("report %+v; want comfy asked once (a plan made again asks no tenant twice)", rep)
			}
			if wait {
				if err != nil || !slices.ContainsFunc(rep.Evicted, func(u vramguard.UnloadReport) bool { return u.Model == "mid:latest" && u.Verified }) {
					t.Fatalf("EnsureFree with WaitForLeases: %v, evicted %+v; want mid unloaded once the other's lease ended", err, rep.Evicted)
				}
				return
			}
			var re *vramguard.RoomError
			if !errors.As(err, &re) || !errors.Is(err, vramguard.KindOutOfMemory) || !errors.Is(err, vramguard.ErrLeased) {
				t.Fatalf("EnsureFree: %v; want a *RoomError matching ErrLeased", err)
			}
			if errors.Is(err, context.DeadlineExceeded) || re.Err != nil {
				t.Fatalf("EnsureFree: %v; want refused by arithmetic once the lease came, not after waiting out its bound", err)
			}
			if len(re.Kept) != 1 || re.Kept[0].Model != "mid:latest" || len(re.Kept[0].Leases) != 1 || re.RetryAfter <= 0 {
				t.Fatalf("kept %+v, retry after %v; want mid, kept by the other's lease, and its end", re.Kept, re.RetryAfter)
			}
			if len(rep.Plan) != 2 || rep.Plan[0] != "comfy" || rep.Plan[1] != "mid:latest" {
				t.Fatalf("Plan %v; want the first plan, comfy then mid", rep.Plan)
			}
		})
	}
}

// flickerReader shows the device's own free memory at odd readings and
// 8 GiB less (another program allocating and freeing) at even ones.
type flickerReader struct {
	vramguard.VRAMReader
	n atomic.Int64
}

func (r *flickerReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	snap, err := r.VRAMReader.Snapshot(ctx)
	if err != nil || r.n.Add(1)%2 == 1 {
		return snap, err
	}
	out := *snap
	out.Devices = slices.Clone(snap.Devices)
	out.Devices[0].Free -= min(out.Devices[0].Free, 8*gib)
	return &out, nil
}

// Room-making whose plan the device contradicts at each hold on the room
// (keepRoom reads it again, under the lease directory's lock: another
// program allocating meanwhile) plans again, twice, then refuses before
// anything is unloaded, saying so, as a plan that cannot make the room is.
func TestRoomRefusedWhenEachPlanIsStale(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	loadForever(t, s, "mid") // 18 GiB free of 24
	r := &flickerReader{VRAMReader: &vramguardtest.GPU{Server: s}}
	c := leaseClient(t, s, leaseDir(t), vramguard.Options{VRAM: r})
	rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 20 * gib, Timeout: time.Second})
	var re *vramguard.RoomError
	if !errors.As(err, &re) || !errors.Is(err, vramguard.KindOutOfMemory) || re.Err == nil || !strings.Contains(re.Err.Error(), "changed between each of 3 plans") {
		t.Fatalf("EnsureFree: %v; want a *RoomError saying the device changed between each plan and its hold", err)
	}
	if rep != nil && len(rep.Evicted) != 0 || !s.Listed("mid") {
		t.Fatalf("evicted %+v, mid listed %v; want nothing unloaded", rep.Evicted, s.Listed("mid"))
	}
	if got := r.n.Load(); got != 6 {
		t.Errorf("%d readings; want 6 (three plans, three holds)", got)
	}
}
