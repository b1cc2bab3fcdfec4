package vramguard_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// reservationFiles counts the reservation files in the lease directory.
func reservationFiles(t *testing.T, dir string) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*.reserve"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// roomErr is err's *RoomError, failing the test when there is none.
func roomErr(t *testing.T, err error) *vramguard.RoomError {
	t.Helper()
	var re *vramguard.RoomError
	if !errors.As(err, &re) {
		t.Fatalf("err = %v, want a *RoomError", err)
	}
	return re
}

// checkNamesReservation checks a refusal names the reservation for as a
// holder, with its end as the retry-after.
func checkNamesReservation(t *testing.T, err error, forWhom string) {
	t.Helper()
	if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.Is(err, vramguard.ErrLeased) {
		t.Fatalf("err = %v, want KindOutOfMemory matching ErrLeased", err)
	}
	re := roomErr(t, err)
	if len(re.Reserved) != 1 || re.Reserved[0].For != forWhom || re.Reserved[0].PID != os.Getpid() || re.Reserved[0].Until.IsZero() {
		t.Fatalf("Reserved = %+v, want the reservation for %q", re.Reserved, forWhom)
	}
	named := false
	for _, h := range re.Holders {
		named = named || h.Kind == vramguard.HolderReserved && strings.Contains(h.Name, forWhom) && h.Bytes > 0
	}
	if !named {
		t.Errorf("Holders = %+v, want a HolderReserved share naming %q", re.Holders, forWhom)
	}
	if re.RetryAfter <= 0 || re.RetryAfter > time.Until(re.Reserved[0].Until)+time.Second {
		t.Errorf("RetryAfter = %v, want the time to the reservation's end (%v)", re.RetryAfter, re.Reserved[0].Until)
	}
	if !strings.Contains(err.Error(), forWhom) {
		t.Errorf("message %q does not name the recipient", err)
	}
}

// The seed's OOM, with reservations: an orchestrator's phase hands 20 GiB
// over to a render; a second vramguard program's budget load, with and
// without MakeRoom, is refused while the reservation stands, naming it;
// the render allocates the whole room with no out-of-memory; once the
// reservation is released the load is admitted.
func TestHandoverReservesForTheRender(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
	if err := s.Reserve("desktop", 2*gib); err != nil {
		t.Fatal(err)
	}
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	orch := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	chat := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu, Budget: &vramguard.Budget{}})
	eager := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu, Budget: &vramguard.Budget{MakeRoom: true}})

	p, err := orch.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{NeedBytes: 20 * gib, Reserve: vramguard.ReserveOptions{For: "render 42"}})
	if err != nil {
		t.Fatal(err)
	}
	g := p.Guard()
	if _, err := g.Generate(t.Context(), &vramguard.GenerateRequest{Model: "big", Prompt: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	rep, err := p.End(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	res := rep.Handover.Reservation
	if res == nil {
		t.Fatal("the hand-over reserved nothing")
	}
	if info := res.Info(); info.Bytes != 20*gib || info.Device != 0 || info.For != "render 42" || info.Model != "" ||
		info.Until.Before(time.Now().Add(time.Minute)) || info.Until.After(time.Now().Add(2*time.Minute+time.Second)) {
		t.Fatalf("reservation %+v, want 20 GiB on device 0 for render 42 for the default two minutes", info)
	}

	_, err = chat.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "mid", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	checkNamesReservation(t, err, "render 42")
	_, err = eager.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "mid", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	checkNamesReservation(t, err, "render 42")
	if s.Loads("mid") != 0 {
		t.Fatal("a load was admitted into the reserved room")
	}
	if err := s.Reserve("render", 20*gib); err != nil {
		t.Fatalf("the render could not allocate its room: %v", err)
	}
	s.Release("render")
	if err := res.Release(); err != nil {
		t.Fatal(err)
	}
	if reservationFiles(t, dir) != 0 {
		t.Fatal("Release left the reservation's file")
	}
	if _, err := chat.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "mid", Prompt: "x"}, vramguard.KeepAliveUnload, nil); err != nil {
		t.Fatalf("load after the reservation's release: %v", err)
	}
}

// A reservation with the recipient's PID is consumed as the device shows
// that process grow: reserved plus taken stays what was handed over, and
// once the whole room is taken other clients see nothing reserved and the
// holder ends it.
func TestReservationConsumedByItsRecipient(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
	if err := s.Reserve("render", 1<<20); err != nil { // the render's process, before it loads
		t.Fatal(err)
	}
	var pid uint32
	for _, h := range s.Holders() {
		if h.Name == "render" {
			pid = h.PID
		}
	}
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	orch := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	other := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	res, err := orch.Reserve(t.Context(), 0, 20*gib, vramguard.ReserveOptions{For: "render", PID: pid})
	if err != nil {
		t.Fatal(err)
	}
	view := func() (*vramguard.EnsureReport, error) {
		return other.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 1, DryRun: true})
	}
	if err := s.Reserve("render", 8*gib); err != nil {
		t.Fatal(err)
	}
	rep, err := view()
	if err != nil {
		t.Fatal(err)
	}
	d := rep.Snapshot.Device(0)
	_, _, driverFree := s.Memory()
	if len(d.Reserved) != 1 || d.Reserved[0].Taken != 8*gib || driverFree-d.Free != 12*gib {
		t.Fatalf("after 8 GiB allocated: reserved %+v, free %d of the driver's %d; want 8 GiB taken and 12 GiB still reserved", d.Reserved, d.Free, driverFree)
	}
	if err := s.Reserve("render", 12*gib); err != nil {
		t.Fatal(err)
	}
	if rep, err = view(); err != nil {
		t.Fatal(err)
	}
	_, _, driverFree = s.Memory()
	if d := rep.Snapshot.Device(0); len(d.Reserved) != 0 || d.Free != driverFree {
		t.Fatalf("after the whole room was taken: reserved %+v, free %d (driver %d); want nothing reserved", d.Reserved, d.Free, driverFree)
	}
	if reservationFiles(t, dir) != 1 {
		t.Fatal("the reservation ended before its holder looked")
	}
	if _, err := orch.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 1, DryRun: true}); err != nil {
		t.Fatal(err)
	}
	if reservationFiles(t, dir) != 0 {
		t.Fatal("the holder did not end its consumed reservation")
	}
	if err := res.Release(); err != nil {
		t.Fatalf("Release after consumption: %v", err)
	}
}

// Two reservations never share bytes: the second, larger than what the
// first left, is refused naming the first; the holder's own calls may use
// its reservation; another client's EnsureFree cannot make reserved bytes
// free (refused by arithmetic, nothing unloaded).
func TestReservationsAreExclusive(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	a := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu, Budget: &vramguard.Budget{}})
	b := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	loadForever(t, s, "small") // 2 GiB: 22 free
	if _, err := a.Reserve(t.Context(), 0, 16*gib, vramguard.ReserveOptions{For: "encoder"}); err != nil {
		t.Fatal(err)
	}
	_, err := b.Reserve(t.Context(), 0, 8*gib, vramguard.ReserveOptions{For: "second"})
	checkNamesReservation(t, err, "encoder")
	if reservationFiles(t, dir) != 1 {
		t.Fatal("the refused reservation left a file")
	}
	// 6 GiB left for b: enough for 4, and 8 only by unloading small (2).
	if _, err := b.Reserve(t.Context(), 0, 4*gib, vramguard.ReserveOptions{For: "small one"}); err != nil {
		t.Fatalf("a reservation that fits beside the first: %v", err)
	}
	_, err = b.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 10 * gib})
	if re := roomErr(t, err); re.Err != nil || len(re.Reserved) != 1 || re.Reserved[0].For != "encoder" {
		t.Fatalf("EnsureFree past the reservations: %v; want refused by arithmetic naming a's reservation", err)
	}
	if !s.Listed("small") {
		t.Fatal("a refused EnsureFree unloaded a model")
	}
	// a's own budget load of mid (6 GiB) uses a's reservation.
	if _, err := a.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "mid", Prompt: "x"}, vramguard.KeepAliveUnload, nil); err != nil {
		t.Fatalf("the holder's own load inside its reservation: %v", err)
	}
}

// A reservation ends at its TTL; Extend moves its end, and every other
// client sees the new one.
func TestReservationTTLAndExtend(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	a := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	b := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	res, err := a.Reserve(t.Context(), 0, 20*gib, vramguard.ReserveOptions{For: "short", TTL: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Extend(time.Hour); err != nil {
		t.Fatal(err)
	}
	_, err = b.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 10 * gib, DryRun: true})
	re := roomErr(t, err)
	if len(re.Reserved) != 1 || re.Reserved[0].Until.Before(time.Now().Add(59*time.Minute)) {
		t.Fatalf("after Extend(1h) others see %+v", re.Reserved)
	}
	if err := res.Extend(100 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for reservationFiles(t, dir) != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the reservation outlived its TTL by 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := b.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 10 * gib, DryRun: true}); err != nil {
		t.Fatalf("after the TTL: %v", err)
	}
	if err := res.Extend(time.Minute); !errors.Is(err, vramguard.ErrClosed) || !errors.Is(err, vramguard.KindInvalidInput) {
		t.Fatalf("Extend of an ended reservation = %v, want KindInvalidInput wrapping ErrClosed", err)
	}
}

// Bad input: each a typed error, nothing reserved.
func TestReserveRefuses(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	c := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	noReader := leaseClient(t, s, dir, vramguard.Options{})
	off := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu, Leases: vramguard.LeaseOptions{Off: true}})
	open := filepath.Join(t.TempDir(), "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil { // past the umask
		t.Fatal(err)
	}
	refused := leaseClient(t, s, open, vramguard.Options{VRAM: gpu})
	closed := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	_ = closed.Close()
	for _, tc := range []struct {
		name   string
		c      *vramguard.OllamaClient
		device int
		bytes  uint64
		opts   vramguard.ReserveOptions
		kind   vramguard.Kind
		is     error
	}{
		{"negative device", c, -1, gib, vramguard.ReserveOptions{}, vramguard.KindInvalidInput, nil},
		{"zero bytes", c, 0, 0, vramguard.ReserveOptions{}, vramguard.KindInvalidInput, nil},
		{"larger than the device", c, 0, 25 * gib, vramguard.ReserveOptions{}, vramguard.KindInvalidInput, nil},
		{"absurd bytes", c, 0, 1 << 62, vramguard.ReserveOptions{}, vramguard.KindInvalidInput, nil},
		{"no such device", c, 3, gib, vramguard.ReserveOptions{}, vramguard.KindNotFound, nil},
		{"negative TTL", c, 0, gib, vramguard.ReserveOptions{TTL: -time.Second}, vramguard.KindInvalidInput, nil},
		{"absurd TTL", c, 0, gib, vramguard.ReserveOptions{TTL: 1e12 * time.Millisecond}, vramguard.KindInvalidInput, nil},
		{"recipient not printable", c, 0, gib, vramguard.ReserveOptions{For: "a\x00b"}, vramguard.KindInvalidInput, nil},
		{"recipient too long", c, 0, gib, vramguard.ReserveOptions{For: strings.Repeat("x", 300)}, vramguard.KindInvalidInput, nil},
		{"no reader", noReader, 0, gib, vramguard.ReserveOptions{}, vramguard.KindInvalidInput, vramguard.ErrNoVRAMReader},
		{"holder note not printable", c, 0, gib, vramguard.ReserveOptions{Note: "a\nb"}, vramguard.KindInvalidInput, nil},
		{"leases off", off, 0, gib, vramguard.ReserveOptions{}, vramguard.KindUnavailable, nil},
		{"lease directory refused", refused, 0, gib, vramguard.ReserveOptions{}, vramguard.KindUnavailable, nil},
		{"closed client", closed, 0, gib, vramguard.ReserveOptions{}, vramguard.KindUnavailable, vramguard.ErrClosed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := tc.c.Reserve(t.Context(), tc.device, tc.bytes, tc.opts)
			if l != nil || !errors.Is(err, tc.kind) || tc.is != nil && !errors.Is(err, tc.is) {
				t.Fatalf("Reserve = %v, %v; want %v %v", l, err, tc.kind, tc.is)
			}
		})
	}
	if n := reservationFiles(t, dir); n != 0 {
		t.Fatalf("%d reservation files after refusals", n)
	}
	res, err := c.Reserve(t.Context(), 0, gib, vramguard.ReserveOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []time.Duration{-time.Second, 0, 2 * time.Hour} {
		if err := res.Extend(d); !errors.Is(err, vramguard.KindInvalidInput) {
			t.Errorf("Extend(%v) of a reservation = %v, want KindInvalidInput", d, err)
		}
	}
	if _, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: gib, DryRun: true, Reservation: &vramguard.ReserveOptions{}}); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("EnsureFree with DryRun and Reservation = %v, want KindInvalidInput", err)
	}
	if _, err := c.StartPhase(t.Context(), "p", vramguard.PhaseOptions{NeedBytes: gib, Reserve: vramguard.ReserveOptions{TTL: -1}}); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("StartPhase with a negative reservation TTL = %v, want KindInvalidInput", err)
	}
	// Close ends the client's reservations.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := reservationFiles(t, dir); n != 0 {
		t.Fatalf("%d reservation files after Close", n)
	}
}

// EnsureFree with Reservation keeps the room it made; NoReserve hands a
// phase's room over without one.
func TestEnsureFreeReservesTheRoom(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
	loadForever(t, s, "big", "mid")
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	a := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	b := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	rep, err := a.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 14 * gib, Reserve: gib, Reservation: &vramguard.ReserveOptions{For: "encoder load"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Reservation == nil || rep.Reservation.Info().Bytes != 15*gib || len(rep.Evicted) == 0 {
		t.Fatalf("report %+v: want the 15 GiB made (models evicted) and reserved", rep)
	}
	_, err = b.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 10 * gib, DryRun: true})
	checkNamesReservation(t, err, "encoder load")

	p, err := b.StartPhase(t.Context(), "free", vramguard.PhaseOptions{NeedBytes: gib, NoReserve: true})
	if err != nil {
		t.Fatal(err)
	}
	prep, err := p.End(t.Context())
	if err != nil || prep.Handover.Reservation != nil {
		t.Fatalf("NoReserve phase: %+v, %v; want no reservation", prep.Handover, err)
	}
	if n := reservationFiles(t, dir); n != 1 {
		t.Fatalf("%d reservation files, want a's alone", n)
	}
}

// staticGPU reads one device that is all free, named uuid: what another
// program's own GPU reader reports of the device a test's simulator fakes.
type staticGPU struct {
	uuid  string
	total uint64
}

func (g staticGPU) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	return &vramguard.VRAMSnapshot{Source: "static", Taken: time.Now(), Devices: []vramguard.DeviceMemory{
		{Index: 0, UUID: g.uuid, Total: g.total, Free: g.total, Processes: []vramguard.GPUProcess{}, ProcessesKnown: true}}}, nil
}

// reserveHolderMain is the second program of
// TestReservationDiesWithItsProcess: it reserves 20 GiB on the device
// named in spec ("host dir uuid") and waits to be killed.
func reserveHolderMain(spec string) {
	f := strings.Fields(spec)
	c, err := vramguard.NewClient(vramguard.Options{Host: f[0], VRAM: staticGPU{uuid: f[2], total: 24 * gib}, Leases: vramguard.LeaseOptions{Dir: f[1]}})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	if _, err := c.Reserve(context.Background(), 0, 20*gib, vramguard.ReserveOptions{For: "render in another process", TTL: time.Hour}); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("reserved")
	select {}
}

// A reservation dies with its process: the test binary, started again as
// another program, reserves 20 GiB of the device and is killed with
// SIGKILL; this program's budget load, refused while it lived (naming its
// pid), is admitted at once after.
func TestReservationDiesWithItsProcess(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
	dir := leaseDir(t)
	b := leaseClient(t, s, dir, vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{}})
	snap, err := s.GPU().Snapshot(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "VRAMGUARD_RESERVE_HOLDER="+s.URL().String()+" "+dir+" "+snap.Devices[0].UUID)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "reserved") {
		t.Fatalf("holder: %q, %v", line, err)
	}
	_, err = b.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "big", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	re := roomErr(t, err)
	if len(re.Reserved) != 1 || re.Reserved[0].PID != cmd.Process.Pid || re.Reserved[0].For != "render in another process" || s.Loads("big") != 0 {
		t.Fatalf("load while the other process reserves: %v; want refused naming pid %d", err, cmd.Process.Pid)
	}
	if err := cmd.Process.Kill(); err != nil { // SIGKILL: no cleanup of its own
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, err := b.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "big", Prompt: "x"}, vramguard.KeepAliveUnload, nil); err != nil {
		t.Fatalf("load after the holder was killed: %v; want admitted at once", err)
	}
}

// A load a budget admits is reserved host-wide until it lands: another
// client's reading during the load sees its bytes as taken (the runner
// shows none of them yet), and none once the server lists the model.
// A hand-over begun during the load, whose room needs those bytes, waits
// for the load to land and then makes its room by unloading the landed
// model (not refusing, and not handing over bytes the load takes).
func TestAdmittedLoadReservedUntilItLands(t *testing.T) {
	s := newSim(t, vramguardtest.Config{TotalVRAM: 16 * gib, StrictVRAM: true},
		vramguardtest.ModelConfig{Name: "chat", SizeVRAM: 6 * gib, LoadLatency: 400 * time.Millisecond})
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	chatUI := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu, Budget: &vramguard.Budget{}})
	orch := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	est, err := chatUI.EstimateModel(t.Context(), "chat", 0)
	if err != nil {
		t.Fatal(err)
	}
	gen := make(chan error, 1)
	go func() {
		_, err := chatUI.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "chat", Prompt: "x"}, vramguard.KeepAliveFor(time.Minute), nil)
		gen <- err
	}()
	var during *vramguard.DeviceMemory
	for deadline := time.Now().Add(10 * time.Second); during == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no reservation of the admitted load seen within 10 s")
		}
		rep, err := orch.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 1, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if d := rep.Snapshot.Device(0); len(d.Reserved) == 1 {
			during = d
		}
	}
	if r := during.Reserved[0]; r.Load != "chat:latest" || r.Bytes != uint64(est.Total) || s.Listed("chat") {
		t.Fatalf("during the load: %+v (listed %v); want the load's estimate reserved, the model not listed yet", r, s.Listed("chat"))
	}
	p, err := orch.StartPhase(t.Context(), "render prep", vramguard.PhaseOptions{NeedBytes: 14 * gib})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := p.End(t.Context())
	if err := <-gen; err != nil {
		t.Fatalf("the chat generation: %v", err)
	}
	if err != nil {
		t.Fatalf("hand-over during another program's load: %v; want it to wait for the load and make its room", err)
	}
	if rep.Handover.FreeAfter < 14*gib || s.Listed("chat") || len(rep.Handover.Evicted) != 1 {
		t.Fatalf("hand-over %+v (chat listed %v); want 14 GiB made by unloading the landed model", rep.Handover, s.Listed("chat"))
	}
	if err := s.Reserve("render", 14*gib); err != nil {
		t.Fatalf("the render could not allocate its room: %v", err)
	}
}

// A reservation another process overdrew (it allocated into the reserved
// bytes, not the recipient) is owed first: room-making for another client
// plans the need plus what the reservation lacks, so it unloads enough at
// once (big, 8 GiB) instead of the least that would have done without the
// reservation (small, 2 GiB) and then being refused (composition oracle,
// seed 1796422898705029008). Its holder's share (DeviceMemory.Holders) is
// the free memory it still keeps.
func TestOverdrawnReservationIsOwedFirst(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	loadForever(t, s, "big", "small") // 14 GiB free of 24
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	a := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	b := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	if _, err := a.Reserve(t.Context(), 0, 10*gib, vramguard.ReserveOptions{For: "render", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve("intruder", 10*gib); err != nil { // 4 GiB left to the driver: the reservation lacks 6
		t.Fatal(err)
	}
	dry, err := b.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 1, DryRun: true})
	if err != nil || dry.FreeBefore != 0 || dry.Snapshot.Device(0).Overdrawn != 6*gib || len(dry.Plan) != 1 || dry.Plan[0] != "big:latest" {
		t.Fatalf("dry run %+v, %v; want nothing free, 6 GiB owed, big planned", dry, err)
	}
	// Its share is the 4 GiB of free memory it keeps, not the 10 it has
	// left: the shares still add up to the device's total.
	d := dry.Snapshot.Device(0)
	var sum, reserved uint64
	for _, h := range d.Holders() {
		sum += h.Bytes
		if h.Kind == vramguard.HolderReserved {
			reserved += h.Bytes
		}
	}
	if sum != d.Total || reserved != 4*gib {
		t.Fatalf("holders %+v: %d bytes of %d, reserved share %d; want the total, and 4 GiB reserved", d.Holders(), sum, d.Total, reserved)
	}
	// Two reservations, 10 and 3 GiB left, 4 GiB of the driver's free
	// memory kept: the first listed keeps its share whole as far as it
	// goes, the later ones get the rest, and the shares still add up.
	two := *d
	two.Reserved = append(slices.Clone(d.Reserved), vramguard.LeaseInfo{ID: "second", Bytes: 3 * gib, Device: 0})
	two.Overdrawn += 3 * gib
	var shares []uint64
	sum = 0
	for _, h := range two.Holders() {
		sum += h.Bytes
		if h.Kind == vramguard.HolderReserved {
			shares = append(shares, h.Bytes)
		}
	}
	if sum != d.Total || !slices.Equal(shares, []uint64{4 * gib, 0}) {
		t.Fatalf("two reservations overdrawn: shares %v, %d bytes of %d; want [4 GiB, 0] and the total", shares, sum, d.Total)
	}
	rep, err := b.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 2 * gib, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("EnsureFree(2 GiB) beside an overdrawn reservation: %v; want big unloaded and the room made", err)
	}
	if len(rep.Evicted) != 1 || rep.Evicted[0].Model != "big:latest" || !s.Listed("small") {
		t.Fatalf("evicted %+v, small listed %v; want big alone", rep.Evicted, s.Listed("small"))
	}
	if d := rep.Snapshot.Device(0); d.Overdrawn != 0 || d.Free < 2*gib {
		t.Fatalf("after: free %d, overdrawn %d; want the room with the reservation whole", d.Free, d.Overdrawn)
	}
}

// Room-making beside an overdrawn reservation, in two steps: the first
// step's unload pays part of the debt and the view shows nothing free yet;
// the wait after it measures the step, not the view's free memory, and
// the second step makes the room (composition oracle seed
// 1796437259495622033: the wait after the first unload waited its whole
// bound for bytes the view could not show, and the call was refused after
// evicting).
func TestRoomMadeInStepsBesideAnOverdrawnReservation(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	loadForever(t, s, "small") // another program's idle model: the first tier
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	render := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	maker := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	warmModel(t, maker, "mid")
	held, err := maker.HoldModel(t.Context(), "mid", 0) // its own leased model: the second tier
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release()
	if _, err := render.Reserve(t.Context(), 0, 16*gib, vramguard.ReserveOptions{For: "render", TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve("intruder", 4*gib); err != nil { // the reservation lacks 4 GiB
		t.Fatal(err)
	}
	rep, err := maker.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 4 * gib, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatalf("EnsureFree(4 GiB) beside a reservation overdrawn by 4 GiB: %v; want small, then mid, unloaded and the room made", err)
	}
	var evicted []string
	for _, r := range rep.Evicted {
		evicted = append(evicted, r.Model)
	}
	if strings.Join(evicted, ",") != "small:latest,mid:latest" {
		t.Fatalf("evicted %v; want small, then mid", evicted)
	}
	if d := rep.Snapshot.Device(0); d.Overdrawn != 0 || d.Free < 4*gib {
		t.Fatalf("after: free %d, overdrawn %d; want the room with the reservation whole", d.Free, d.Overdrawn)
	}
}

// Room-making keeps the room it makes, host-wide, from its plan on: what
// its steps free is not another program's to take before the device shows
// it free to the maker (composition oracle seeds 1796429849072189095 and
// 1796429849072185979: a chat program's budget loaded into room a pool's
// placement and an EnsureFree were making, and the maker was refused after
// evicting, or waited out its bound). Here the plan's first step, a
// tenant's release, frees 10 GiB, and in that window another client's
// Reserve and a budget's load are tried: both are refused, naming the room
// being made, and so is another client's EnsureFree (which, before the
// step, sees the device overdrawn by the hold), and the maker gets its
// room. The hold ends with the call, or
// becomes the reservation the call asked for; nothing is left behind.
func TestRoomKeptWhileItIsMade(t *testing.T) {
	const making = "the room it is making"
	for _, tc := range []struct {
		name string
		make func(t *testing.T, orch *vramguard.OllamaClient) (*vramguard.Lease, error)
		// reserved: the recipient the maker's call left a reservation for
		reserved string
	}{
		{"EnsureFree", func(t *testing.T, orch *vramguard.OllamaClient) (*vramguard.Lease, error) {
			rep, err := orch.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 12 * gib})
			if err == nil && rep.FreeAfter < 12*gib {
				t.Errorf("EnsureFree: FreeAfter %d, want the 12 GiB", rep.FreeAfter)
			}
			return nil, err
		}, ""},
		{"EnsureFree with Reservation", func(t *testing.T, orch *vramguard.OllamaClient) (*vramguard.Lease, error) {
			rep, err := orch.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 12 * gib, Reservation: &vramguard.ReserveOptions{For: "render 7"}})
			if err != nil {
				return nil, err
			}
			return rep.Reservation, nil
		}, "render 7"},
		{"a budget's MakeRoom", func(t *testing.T, orch *vramguard.OllamaClient) (*vramguard.Lease, error) {
			_, err := orch.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "big", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil)
			return nil, err
		}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
			if err := s.Reserve("desktop", 12*gib); err != nil {
				t.Fatal(err)
			}
			if err := s.Reserve("comfy", 10*gib); err != nil {
				t.Fatal(err)
			}
			dir := leaseDir(t)
			gpu := &vramguardtest.GPU{Server: s}
			orch := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu, Budget: &vramguard.Budget{MakeRoom: true}})
			other := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
			chat := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu, Budget: &vramguard.Budget{}})
			var tried bool
			var rerr, gerr, eerr error // what the others got in the window
			var owed uint64            // the device as another client saw it before the step
			unregister, err := orch.RegisterTenant(vramguard.Tenant{Name: "comfy", Bytes: 10 * gib, First: true, Release: func(ctx context.Context) error {
				if dry, err := other.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: 1, DryRun: true}); dry != nil && dry.Snapshot != nil {
					owed = dry.Snapshot.Device(0).Overdrawn
				} else {
					t.Errorf("a dry run before the step: %v", err)
				}
				s.Release("comfy")
				tried = true
				_, rerr = other.Reserve(ctx, 0, 6*gib, vramguard.ReserveOptions{For: "someone else"})
				_, gerr = chat.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "mid", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil)
				_, eerr = other.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: 6 * gib})
				return nil
			}})
			if err != nil {
				t.Fatal(err)
			}
			defer unregister()
			res, err := tc.make(t, orch)
			if err != nil {
				t.Fatalf("the maker: %v", err)
			}
			if !tried {
				t.Fatal("the tenant was not asked: the room was there")
			}
			checkNamesReservation(t, rerr, making)
			checkNamesReservation(t, gerr, making)
			checkNamesReservation(t, eerr, making) // another client's room-making too
			if owed == 0 {
				t.Error("before the step another client saw the device not overdrawn; want the hold's bytes beyond the 2 GiB free")
			}
			// The hold is renewed while its call runs, a few seconds at a
			// time: a refusal it causes says to retry within those.
			if ra := roomErr(t, rerr).RetryAfter; ra > 5*time.Second {
				t.Errorf("RetryAfter %v of a refusal by a room being made; want at most the hold's 5 s span", ra)
			}
			if s.Loads("mid") != 0 {
				t.Fatal("the chat program's load was admitted into the room being made")
			}
			if tc.reserved != "" {
				if res == nil || res.Info().For != tc.reserved || res.Info().Bytes != 12*gib {
					t.Fatalf("reservation %v, want 12 GiB for %s", res, tc.reserved)
				}
				if reservationFiles(t, dir) != 1 {
					t.Fatalf("%d reservation files, want the reservation only (the hold on the room ended)", reservationFiles(t, dir))
				}
				_, err := other.Reserve(t.Context(), 0, 6*gib, vramguard.ReserveOptions{For: "someone else"})
				checkNamesReservation(t, err, tc.reserved)
				if err := res.Release(); err != nil {
					t.Fatal(err)
				}
			}
			if n := reservationFiles(t, dir); n != 0 {
				t.Fatalf("%d reservation files after the call: the hold on the room was left", n)
			}
			l, err := other.Reserve(t.Context(), 0, 2*gib, vramguard.ReserveOptions{For: "after"})
			if err != nil {
				t.Fatalf("Reserve after the room was made: %v", err)
			}
			_ = l.Release()
		})
	}
}

// A budget's room-making keeps the room its arithmetic counts on, and its
// hold names the load: with Budget.MaxBytes the target counts the memory
// already free (the room is made by lowering what Ollama's runners hold),
// so that memory is kept too while the room is made (were it not, another
// program taking it would leave the maker refused after evicting). Here,
// while comfy releases, another client's Reserve of 6 GiB is refused,
// naming the load, and the load is admitted.
func TestBudgetHoldNamesItsLoad(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
	loadForever(t, s, "mid", "small") // Ollama holds 8 GiB
	if err := s.Reserve("comfy", 2*gib); err != nil {
		t.Fatal(err)
	}
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	orch := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu, Budget: &vramguard.Budget{MakeRoom: true, MaxBytes: 11 * gib}})
	other := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	var rerr error
	unregister, err := orch.RegisterTenant(vramguard.Tenant{Name: "comfy", Bytes: 2 * gib, First: true, Release: func(ctx context.Context) error {
		s.Release("comfy")
		_, rerr = other.Reserve(ctx, 0, 6*gib, vramguard.ReserveOptions{For: "someone else"})
		return nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer unregister()
	if _, err := orch.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "big", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		t.Fatalf("the budget's load: %v", err)
	}
	checkNamesReservation(t, rerr, "the room it is making")
	if re := roomErr(t, rerr); re.Reserved[0].Note != "budget, for the load of big" {
		t.Errorf("the hold's Note %q; want it to name the load", re.Reserved[0].Note)
	}
	if n := reservationFiles(t, dir); n != 0 {
		t.Fatalf("%d reservation files after the load landed", n)
	}
}

// The hold lasts as long as its call: an unload whose verification takes
// longer than room-making's own wait bound (EnsureRequest.Timeout), and
// longer than the hold's own 5 s span, does not outlive it (the call
// renews it). Seen at the end of the unload, 6 s after the hold was
// taken, with a 100 ms Timeout.
func TestRoomHeldThroughASlowUnload(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true, UnloadDelay: 6 * time.Second})
	if err := s.Reserve("desktop", 12*gib); err != nil {
		t.Fatal(err)
	}
	loadForever(t, s, "mid") // 6 GiB free of 24
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	other := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	var files int
	var rerr error
	maker := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu, UnloadTimeout: 10 * time.Second, Hooks: vramguard.Hooks{
		OnUnloadEnd: func(ctx context.Context, _ vramguard.UnloadEnd) {
			files = reservationFiles(t, dir)
			_, rerr = other.Reserve(ctx, 0, 6*gib, vramguard.ReserveOptions{For: "someone else"})
		}}})
	if _, err := maker.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 12 * gib, Timeout: 100 * time.Millisecond}); err != nil {
		t.Fatalf("EnsureFree: %v", err)
	}
	if files != 1 {
		t.Fatalf("%d reservation files as the unload ended; want the hold on the room", files)
	}
	checkNamesReservation(t, rerr, "the room it is making")
	if ra := roomErr(t, rerr).RetryAfter; ra > 5*time.Second {
		t.Errorf("RetryAfter %v, 6 s into the call; want at most the renewed hold's 5 s span", ra)
	}
	if n := reservationFiles(t, dir); n != 0 {
		t.Fatalf("%d reservation files after the call", n)
	}
}

// holdPanicReader panics once, at the first reading after the lease
// directory holds a reservation file.
type holdPanicReader struct {
	vramguard.VRAMReader
	dir      string
	panicked atomic.Bool
}

func (r *holdPanicReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	if m, _ := filepath.Glob(filepath.Join(r.dir, "*.reserve")); len(m) > 0 && r.panicked.CompareAndSwap(false, true) {
		panic("reader broke")
	}
	return r.VRAMReader.Snapshot(ctx)
}

// A panic in the middle of room-making (a reader's, here) ends the hold
// on the room as a return does; the client stays usable.
func TestRoomHoldEndsOnAPanic(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
	loadForever(t, s, "mid")
	dir := leaseDir(t)
	r := &holdPanicReader{VRAMReader: &vramguardtest.GPU{Server: s}, dir: dir}
	maker := leaseClient(t, s, dir, vramguard.Options{VRAM: r})
	func() {
		defer func() {
			if p := recover(); p != "reader broke" {
				t.Fatalf("recovered %v; want the reader's panic", p)
			}
		}()
		_, _ = maker.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 20 * gib})
	}()
	if n := reservationFiles(t, dir); n != 0 {
		t.Fatalf("%d reservation files after the panic: the hold on the room was left", n)
	}
	if _, err := maker.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 20 * gib}); err != nil {
		t.Fatalf("EnsureFree after the panic: %v", err)
	}
}

// A client never sees its own reservations as another holder's, not even
// one it releases or takes while it reads the lease directory: it looks
// at its own before the reading and after it (composition oracle seed
// 1796445258199302218: a pool's phase hand-over was refused, naming the
// hold on the room its own client's EnsureFree had released a moment
// before). One goroutine takes and releases reservations while the other
// reads the device through the client's view.
func TestOwnReservationNeverAnothers(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	c := leaseClient(t, s, leaseDir(t), vramguard.Options{VRAM: &vramguardtest.GPU{Server: s}})
	stop := make(chan struct{})
	churned := make(chan error, 1)
	go func() {
		var err error
		for n := 0; err == nil; n++ {
			select {
			case <-stop:
				churned <- nil
				return
			default:
			}
			var l *vramguard.Lease
			if l, err = c.Reserve(t.Context(), 0, gib, vramguard.ReserveOptions{For: fmt.Sprint("churn ", n)}); err == nil {
				err = l.Release()
			}
		}
		churned <- err
	}()
	for range 500 {
		rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 1, DryRun: true})
		if err != nil {
			t.Fatal(err)
		}
		if r := rep.Snapshot.Device(0).Reserved; len(r) != 0 {
			close(stop)
			t.Fatalf("the client's view lists %+v as another holder's: the reservation is its own", r)
		}
	}
	close(stop)
	if err := <-churned; err != nil {
		t.Fatal(err)
	}
}

// Reservations taken at the same moment by eight clients never share
// bytes: of 5 GiB each on a device with 24 GiB free, exactly four stand,
// and each of the other four is refused naming reservations; the four
// add up to no more than the device had free.
func TestConcurrentReservationsNeverShareBytes(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true}) // 24 GiB, nothing loaded
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	const n = 8
	cs := make([]*vramguard.OllamaClient, n)
	for i := range cs {
		cs[i] = leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	}
	start := make(chan struct{})
	errs := make([]error, n)
	res := make([]*vramguard.Lease, n)
	var wg sync.WaitGroup
	for i, c := range cs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			res[i], errs[i] = c.Reserve(t.Context(), 0, 5*gib, vramguard.ReserveOptions{For: fmt.Sprintf("render %d", i)})
		}()
	}
	close(start)
	wg.Wait()
	var stood uint64
	for i, err := range errs {
		if err == nil {
			stood += res[i].Info().Bytes
			continue
		}
		if re := roomErr(t, err); len(re.Reserved) == 0 || !errors.Is(err, vramguard.ErrLeased) {
			t.Errorf("client %d refused without naming the reservations: %v", i, err)
		}
	}
	if stood != 4*5*gib || reservationFiles(t, dir) != 4 {
		t.Fatalf("%d bytes reserved in %d files; want exactly four of 5 GiB (24 GiB free)", stood, reservationFiles(t, dir))
	}
}

// EnsureRequest.WaitForLeases waits for other holders' reservations, as
// for leases: with a Timeout shorter than the reservation it is refused
// naming it; within its Timeout it waits for one to end (its TTL) and
// makes the room, where without WaitForLeases it is refused at once.
func TestWaitForLeasesWaitsForReservations(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	a := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	b := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	long, err := a.Reserve(t.Context(), 0, 20*gib, vramguard.ReserveOptions{For: "render", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 10 * gib, WaitForLeases: true, Timeout: 200 * time.Millisecond})
	checkNamesReservation(t, err, "render")
	if err := long.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Reserve(t.Context(), 0, 20*gib, vramguard.ReserveOptions{For: "short render", TTL: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	_, err = b.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 10 * gib})
	checkNamesReservation(t, err, "short render")
	rep, err := b.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 10 * gib, WaitForLeases: true, Timeout: 10 * time.Second})
	if err != nil || rep.FreeAfter < 10*gib {
		t.Fatalf("EnsureFree waiting for a reservation's TTL: %+v, %v; want the room once it ended", rep, err)
	}
	if reservationFiles(t, dir) != 0 {
		t.Fatal("the reservation outlived the wait that waited for its end")
	}
}

// A phase's hand-over reserves for "the next stage", held by "phase
// <name>", when PhaseOptions.Reserve names neither; where leases are off
// it hands over without a reservation and without failing.
func TestHandoverReservationDefaults(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	dir := leaseDir(t)
	gpu := &vramguardtest.GPU{Server: s}
	for _, off := range []bool{false, true} {
		c := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu, Leases: vramguard.LeaseOptions{Dir: dir, Off: off}})
		p, err := c.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{NeedBytes: 10 * gib})
		if err != nil {
			t.Fatal(err)
		}
		g := p.Guard()
		if _, err := g.Generate(t.Context(), &vramguard.GenerateRequest{Model: "mid", Prompt: "x"}, nil); err != nil {
			t.Fatal(err)
		}
		rep, err := p.End(t.Context())
		if err != nil || rep.Handover == nil {
			t.Fatalf("leases off %v: End = %+v, %v", off, rep, err)
		}
		res := rep.Handover.Reservation
		switch {
		case off && (res != nil || reservationFiles(t, dir) != 0):
			t.Fatalf("leases off: a reservation %v, %d files", res, reservationFiles(t, dir))
		case off:
		case res == nil:
			t.Fatal("no reservation from a hand-over with NeedBytes")
		case res.Info().For != "the next stage" || res.Info().Note != "phase prompts" || res.Info().Bytes != 10*gib:
			t.Fatalf("the hand-over's reservation %+v; want 10 GiB for \"the next stage\" held by \"phase prompts\"", res.Info())
		default:
			if err := res.Release(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// Where the reader lists no processes, a reservation for a recipient
// process is not consumed: its recipient's allocations are not seen, so
// the reservation stays whole (consumption is measured, never assumed),
// and other clients count all of it until it is released.
func TestReservationWithoutProcessesStaysWhole(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
	if err := s.Reserve("render", 1<<20); err != nil {
		t.Fatal(err)
	}
	pid := s.HeldPID("render")
	dir := leaseDir(t)
	gpu := blindReader{s.GPU()} // lists no processes
	orch := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	other := leaseClient(t, s, dir, vramguard.Options{VRAM: gpu})
	res, err := orch.Reserve(t.Context(), 0, 10*gib, vramguard.ReserveOptions{For: "render", PID: pid})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve("render", 10*gib); err != nil { // the whole room, as the driver shows it
		t.Fatal(err)
	}
	for _, c := range []*vramguard.OllamaClient{other, orch} { // the holder's look ends nothing either
		if _, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 1, DryRun: true}); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := other.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 1, DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	d := rep.Snapshot.Device(0)
	_, _, driverFree := s.Memory()
	if len(d.Reserved) != 1 || d.Reserved[0].Taken != 0 || driverFree-d.Free != 10*gib || reservationFiles(t, dir) != 1 {
		t.Fatalf("reserved %+v, free %d of the driver's %d, %d files; want the reservation whole, nothing taken", d.Reserved, d.Free, driverFree, reservationFiles(t, dir))
	}
	if err := res.Release(); err != nil {
		t.Fatal(err)
	}
}

// EnsureRequest.Reservation reserves from a reading made under the
// host-wide lock after the room is made: another program that takes the
// room in between (here, as the final wait reports the room) leaves the
// call refused with that reading's *RoomError, nothing reserved, no
// reservation file and no hold left.
func TestEnsureFreeReservationRefusedWhenTheRoomIsTaken(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
	loadForever(t, s, "small") // 22 GiB free of 24
	dir := leaseDir(t)
	var once sync.Once
	hooks := vramguard.Hooks{OnVRAMWait: func(_ context.Context, ev vramguard.VRAMWaitEvent) {
		if ev.Err == nil && ev.Need == 23*gib {
			once.Do(func() {
				if err := s.Reserve("intruder", 2*gib); err != nil {
					t.Error(err)
				}
			})
		}
	}}
	c := leaseClient(t, s, dir, vramguard.Options{VRAM: s.GPU(), Hooks: hooks})
	rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 23 * gib, Reservation: &vramguard.ReserveOptions{For: "render"}})
	re := roomErr(t, err)
	if rep == nil || rep.Reservation != nil || len(rep.Evicted) != 1 || re.Free >= 23*gib {
		t.Fatalf("EnsureFree with the room taken before its reservation: %+v, %v; want small evicted, refused, nothing reserved", rep, err)
	}
	if n := reservationFiles(t, dir); n != 0 {
		t.Fatalf("%d reservation files left (the reservation or the hold on the room)", n)
	}
}
