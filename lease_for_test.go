package vramguard_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// leaseFiles counts the lease files (holds on models) in the lease
// directory.
func leaseFiles(t *testing.T, dir string) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.lease"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// holdFor holds model through c for the recipient "chat-ui" (process 4242),
// as a proxy holds it for its HTTP client.
func holdFor(t *testing.T, c *vramguard.OllamaClient, model string, ttl time.Duration) *vramguard.Lease {
	t.Helper()
	l, err := c.Reserve(t.Context(), 0, 0, vramguard.ReserveOptions{Model: model, For: "chat-ui", PID: 4242, Note: "HTTP lease", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// leasedTo checks err is UnloadModel's refusal by a lease held for
// "chat-ui": KindRefused with a *LeasedError naming the recipient, its
// process and the note, in the value and in the message.
func leasedTo(t *testing.T, err error) {
	t.Helper()
	var le *vramguard.LeasedError
	if !errors.Is(err, vramguard.KindRefused) || !errors.Is(err, vramguard.ErrLeased) || !errors.As(err, &le) || len(le.Leases) != 1 {
		t.Fatalf("UnloadModel = %v, want KindRefused with a *LeasedError", err)
	}
	if l := le.Leases[0]; l.For != "chat-ui" || l.ForPID != 4242 || l.Note != "HTTP lease" || l.PID != os.Getpid() || l.Bytes != 0 {
		t.Errorf("LeasedError's lease %+v, want the hold for chat-ui (pid 4242)", l)
	}
	if msg := err.Error(); !strings.Contains(msg, "chat-ui (pid 4242) via ") {
		t.Errorf("message %q does not name the recipient first", msg)
	}
}

// A hold taken for someone else (Reserve with Model) names the recipient
// to every other vramguard client on the host: its UnloadModel is refused
// with the recipient in the *LeasedError and the message, its
// room-making keeps the model and names the recipient in KeptModel.Leases.
// The holder's Lease says the same; Release ends it for all.
func TestHoldForSomeoneElseNamesThem(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	dir := leaseDir(t)
	proxy := leaseClient(t, s, dir, vramguard.Options{}) // no VRAM reader: a hold needs none
	other := leaseClient(t, s, dir, vramguard.Options{VRAM: s.GPU()})
	for _, m := range []string{"big", "mid", "small"} {
		warmModel(t, other, m)
	}
	l := holdFor(t, proxy, "big", time.Hour)
	if info := l.Info(); info.Model != "big:latest" || info.For != "chat-ui" || info.ForPID != 4242 || info.Note != "HTTP lease" ||
		info.Bytes != 0 || info.Until.Before(time.Now().Add(59*time.Minute)) {
		t.Errorf("Info() = %+v", info)
	}

	rep, err := other.UnloadModel(t.Context(), "big")
	leasedTo(t, err)
	if rep == nil || len(rep.Leased) != 1 || rep.Leased[0].For != "chat-ui" || !s.Listed("big") {
		t.Errorf("refused report %+v (big listed %v)", rep, s.Listed("big"))
	}
	// 24 GiB: 8 + 6 + 2 held, 8 free; 20 GiB needs big.
	_, err = other.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 20 * gib, DryRun: true})
	re := roomErr(t, err)
	if len(re.Kept) != 1 || re.Kept[0].Model != "big:latest" || len(re.Kept[0].Leases) != 1 || re.Kept[0].Leases[0].For != "chat-ui" {
		t.Fatalf("Kept = %+v, want big kept by the hold for chat-ui", re.Kept)
	}
	if !strings.Contains(err.Error(), "chat-ui") {
		t.Errorf("refusal %q does not name the recipient", err)
	}

	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if rep, err := other.UnloadModel(t.Context(), "big"); err != nil || !rep.Verified || s.Listed("big") {
		t.Fatalf("UnloadModel after the release: %+v, %v", rep, err)
	}
}

// A hold taken for someone else is not its own client's: that client's
// UnloadModel is refused naming the recipient, and its EnsureFree keeps
// the model (KeptModel.Leases), while a plain HoldModel of the same client
// keeps other clients only (its UnloadModel unloads, its room-making
// takes the model last). ForceUnloadModel overrides the hold, saying so.
func TestHoldForSomeoneElseKeepsItsOwnClient(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	dir := leaseDir(t)
	c := leaseClient(t, s, dir, vramguard.Options{VRAM: s.GPU()})
	for _, m := range []string{"big", "mid", "small"} {
		warmModel(t, c, m)
	}
	holdFor(t, c, "big", time.Hour)
	own, err := c.HoldModel(t.Context(), "mid", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer own.Release()

	_, err = c.UnloadModel(t.Context(), "big")
	leasedTo(t, err)
	if !s.Listed("big") {
		t.Fatal("the holder's UnloadModel unloaded the model it holds for someone else")
	}

	// 8 GiB free; 14 needs 6 more: small's 2 is too little, so the
	// client's own leased mid goes, and big (held for chat-ui) stays.
	rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 14 * gib})
	if err != nil {
		t.Fatalf("EnsureFree: %v", err)
	}
	evicted := map[string]bool{}
	for _, e := range rep.Evicted {
		evicted[e.Model] = true
	}
	if !evicted["mid:latest"] || evicted["big:latest"] || !s.Listed("big") || s.Listed("mid") {
		t.Errorf("evicted %v, want mid (the client's own lease) and not big", evicted)
	}
	kept := false
	for _, k := range rep.Kept {
		kept = kept || k.Model == "big:latest" && len(k.Leases) == 1 && k.Leases[0].For == "chat-ui"
	}
	if !kept {
		t.Errorf("Kept = %+v, want big kept by the hold for chat-ui", rep.Kept)
	}
	// Its room cannot be made without big: refused, naming the recipient.
	_, err = c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 20 * gib})
	if re := roomErr(t, err); !errors.Is(err, vramguard.ErrLeased) || len(re.Kept) != 1 || re.Kept[0].Leases[0].For != "chat-ui" || !s.Listed("big") {
		t.Fatalf("EnsureFree of 20 GiB: %v, Kept %+v; want big kept for chat-ui", err, re.Kept)
	}

	// The client's own lease keeps nothing of its own.
	warmModel(t, c, "mid")
	if rep, err := c.UnloadModel(t.Context(), "mid"); err != nil || !rep.Verified || s.Listed("mid") {
		t.Fatalf("UnloadModel under the client's own HoldModel: %+v, %v; want it unloaded", rep, err)
	}
	if rep, err := c.ForceUnloadModel(t.Context(), "big"); err != nil || !rep.Verified || len(rep.Leased) != 1 || rep.Leased[0].For != "chat-ui" || s.Listed("big") {
		t.Fatalf("ForceUnloadModel: %+v, %v; want big unloaded, the hold for chat-ui overridden", rep, err)
	}
}

// The holder's budget keeps a model it holds for someone else as another
// program's lease: a load that needs its memory is refused naming the
// recipient. With the same client's plain HoldModel instead, the budget
// unloads the model to make the room.
func TestHoldForSomeoneElseKeepsItsBudget(t *testing.T) {
	for _, tc := range []struct {
		name    string
		hold    func(t *testing.T, c *vramguard.OllamaClient) *vramguard.Lease
		refused bool
	}{
		{"for chat-ui", func(t *testing.T, c *vramguard.OllamaClient) *vramguard.Lease { return holdFor(t, c, "big", time.Hour) }, true},
		{"own", func(t *testing.T, c *vramguard.OllamaClient) *vramguard.Lease {
			l, err := c.HoldModel(t.Context(), "big", time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			return l
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := threeModelSim(t, vramguardtest.Config{})
			c := leaseClient(t, s, leaseDir(t), vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{MakeRoom: true}, VRAMPollInterval: 20 * time.Millisecond})
			warmModel(t, c, "big")
			if err := s.Reserve("comfyui", 14*gib); err != nil { // 24 - 8 - 14: 2 GiB free
				t.Fatal(err)
			}
			defer tc.hold(t, c).Release()
			_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "mid", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
			if !tc.refused {
				if err != nil || s.Listed("big") {
					t.Fatalf("load beside the client's own lease: %v (big listed %v); want big unloaded for it", err, s.Listed("big"))
				}
				return
			}
			var re *vramguard.RoomError
			if !errors.As(err, &re) || re.Budget == nil || !errors.Is(err, vramguard.ErrLeased) || len(re.Kept) != 1 || !s.Listed("big") {
				t.Fatalf("load: %v (big listed %v); want the budget's RoomError keeping big", err, s.Listed("big"))
			}
			if l := re.Kept[0].Leases; len(l) != 1 || l[0].For != "chat-ui" || !strings.Contains(err.Error(), "chat-ui") {
				t.Errorf("Kept %+v, message %q: want the hold for chat-ui named", re.Kept, err)
			}
		})
	}
}

// A hold for someone else always has an end: TTL zero is two minutes,
// Extend moves it (every client sees the new end) but not to zero or
// past an hour, and Release ends it; an ended hold cannot be extended.
// Close releases the holds the client took.
func TestHoldForSomeoneElseTTLExtendClose(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	dir := leaseDir(t)
	c := leaseClient(t, s, dir, vramguard.Options{})
	other := leaseClient(t, s, dir, vramguard.Options{})
	warmModel(t, other, "small")
	l := holdFor(t, c, "small", 0)
	if u := l.Info().Until; u.Before(time.Now().Add(110*time.Second)) || u.After(time.Now().Add(2*time.Minute)) {
		t.Errorf("TTL 0 ends at %v, want two minutes from now", u)
	}
	if err := l.Extend(time.Hour); err != nil {
		t.Fatal(err)
	}
	_, err := other.UnloadModel(t.Context(), "small")
	var le *vramguard.LeasedError
	if !errors.As(err, &le) || len(le.Leases) != 1 || le.Leases[0].Until.Before(time.Now().Add(59*time.Minute)) || le.Leases[0].For != "chat-ui" {
		t.Fatalf("after Extend(1h) another client sees %v", err)
	}
	for _, d := range []time.Duration{-time.Second, 0, 2 * time.Hour} {
		if err := l.Extend(d); !errors.Is(err, vramguard.KindInvalidInput) {
			t.Errorf("Extend(%v) of a hold for someone else = %v, want KindInvalidInput", d, err)
		}
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	if n := leaseFiles(t, dir); n != 0 {
		t.Fatalf("%d lease files after Release", n)
	}
	if err := l.Extend(time.Minute); !errors.Is(err, vramguard.ErrClosed) || !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("Extend of a released hold = %v, want KindInvalidInput wrapping ErrClosed", err)
	}

	holdFor(t, c, "small", time.Hour)
	holdFor(t, c, "small", time.Hour)
	if n := leaseFiles(t, dir); n != 2 {
		t.Fatalf("%d lease files, want 2", n)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := leaseFiles(t, dir); n != 0 {
		t.Fatalf("%d lease files after Close", n)
	}
	if rep, err := other.UnloadModel(t.Context(), "small"); err != nil || !rep.Verified {
		t.Fatalf("UnloadModel after the holder's Close: %+v, %v", rep, err)
	}
}

// Bad holds, and a Model where a reservation of room is asked for: each
// KindInvalidInput (leases off KindUnavailable, a closed client
// ErrClosed), no lease taken.
func TestHoldForSomeoneElseRefuses(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	c := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	off := leaseClient(t, s, dir, vramguard.Options{Leases: vramguard.LeaseOptions{Off: true}})
	closed := leaseClient(t, s, dir, vramguard.Options{})
	_ = closed.Close()
	hold := func(o vramguard.ReserveOptions) vramguard.ReserveOptions {
		o.Model = "small"
		if o.For == "" {
			o.For = "chat-ui"
		}
		return o
	}
	for _, tc := range []struct {
		name   string
		c      *vramguard.OllamaClient
		device int
		bytes  uint64
		opts   vramguard.ReserveOptions
		kind   vramguard.Kind
		is     error
	}{
		{"bytes with a model", c, 0, gib, hold(vramguard.ReserveOptions{}), vramguard.KindInvalidInput, nil},
		{"device with a model", c, 1, 0, hold(vramguard.ReserveOptions{}), vramguard.KindInvalidInput, nil},
		{"bad model name", c, 0, 0, vramguard.ReserveOptions{Model: "a b"}, vramguard.KindInvalidInput, nil},
		{"no recipient named", c, 0, 0, vramguard.ReserveOptions{Model: "small", For: " "}, vramguard.KindInvalidInput, nil},
		{"blank model name", c, 0, 0, vramguard.ReserveOptions{Model: " "}, vramguard.KindInvalidInput, nil},
		{"recipient not printable", c, 0, 0, hold(vramguard.ReserveOptions{For: "a\x00b"}), vramguard.KindInvalidInput, nil},
		{"recipient too long", c, 0, 0, hold(vramguard.ReserveOptions{For: strings.Repeat("x", 300)}), vramguard.KindInvalidInput, nil},
		{"note not printable", c, 0, 0, hold(vramguard.ReserveOptions{Note: "a\nb"}), vramguard.KindInvalidInput, nil},
		{"load with a model", c, 0, 0, hold(vramguard.ReserveOptions{Load: "small"}), vramguard.KindInvalidInput, nil},
		{"negative TTL", c, 0, 0, hold(vramguard.ReserveOptions{TTL: -time.Second}), vramguard.KindInvalidInput, nil},
		{"TTL over an hour", c, 0, 0, hold(vramguard.ReserveOptions{TTL: 2 * time.Hour}), vramguard.KindInvalidInput, nil},
		{"leases off", off, 0, 0, hold(vramguard.ReserveOptions{}), vramguard.KindUnavailable, nil},
		{"closed client", closed, 0, 0, hold(vramguard.ReserveOptions{}), vramguard.KindUnavailable, vramguard.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := tc.c.Reserve(t.Context(), tc.device, tc.bytes, tc.opts)
			if l != nil || !errors.Is(err, tc.kind) || tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("Reserve = %v, %v; want %v %v", l, err, tc.kind, tc.is)
			}
		})
	}
	if _, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: gib, Reservation: &vramguard.ReserveOptions{Model: "small"}}); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("EnsureFree with a Reservation naming a model = %v, want KindInvalidInput", err)
	}
	if _, err := c.StartPhase(t.Context(), "p", vramguard.PhaseOptions{NeedBytes: gib, Reserve: vramguard.ReserveOptions{Model: "small"}}); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("StartPhase with a reservation naming a model = %v, want KindInvalidInput", err)
	}
	if n, r := leaseFiles(t, dir), reservationFiles(t, dir); n != 0 || r != 0 {
		t.Fatalf("%d lease and %d reservation files after refusals", n, r)
	}
}

// LeaseInfo.String names the holder; a hold for someone else names the
// recipient first.
func TestLeaseInfoString(t *testing.T) {
	until := time.Date(2026, 1, 2, 12, 0, 1, 0, time.Local)
	for _, tc := range []struct {
		name string
		info vramguard.LeaseInfo
		want string
	}{
		{"hold", vramguard.LeaseInfo{Model: "m", Program: "caption", PID: 42, Note: "phase prompts", Until: until}, "caption (pid 42, phase prompts, until 12:00:01)"},
		{"hold for someone else", vramguard.LeaseInfo{Model: "m", Program: "vramgate", PID: 42, For: "chat-ui", Until: until}, "chat-ui via vramgate (pid 42, until 12:00:01)"},
		{"with the recipient's process", vramguard.LeaseInfo{Model: "m", Program: "vramgate", PID: 42, For: "chat-ui", ForPID: 7, Note: "HTTP lease"}, "chat-ui (pid 7) via vramgate (pid 42, HTTP lease)"},
		{"recipient known by its process", vramguard.LeaseInfo{Model: "m", Program: "vramgate", PID: 42, ForPID: 7}, "pid 7 via vramgate (pid 42)"},
		{"recipient not printable", vramguard.LeaseInfo{Model: "m", Program: "vramgate", PID: 42, For: "a\x1bb"}, `"a\x1bb" via vramgate (pid 42)`},
		{"reservation", vramguard.LeaseInfo{Program: "orchestrator", PID: 42, Bytes: 10 << 30, For: "ComfyUI render 42", ForPID: 7, Until: until}, "orchestrator (pid 42, 10.0 GiB on device 0 for ComfyUI render 42, until 12:00:01)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.info.String(); got != tc.want {
				t.Errorf("String() = %q, want %q", got, tc.want)
			}
		})
	}
}
