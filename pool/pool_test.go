package pool_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/pool"
	"github.com/vramguard/vramguard/vramguardtest"
)

// poolSims starts n simulators, each with its own device of total bytes,
// and the models a (3 GiB) and b (5 GiB), and c (9 GiB).
func poolSims(t *testing.T, totals ...uint64) []*vramguardtest.Server {
	t.Helper()
	var out []*vramguardtest.Server
	for _, total := range totals {
		out = append(out, newSim(t, vramguardtest.Config{TotalVRAM: total, StrictVRAM: true},
			vramguardtest.ModelConfig{Name: "a", SizeVRAM: 3 * gib, LoadLatency: 20 * time.Millisecond},
			vramguardtest.ModelConfig{Name: "b", SizeVRAM: 5 * gib, LoadLatency: 20 * time.Millisecond},
			vramguardtest.ModelConfig{Name: "c", SizeVRAM: 9 * gib, LoadLatency: 20 * time.Millisecond}))
	}
	return out
}

func newTestPool(t *testing.T, sims []*vramguardtest.Server, opts vramguard.Options) *pool.Pool {
	t.Helper()
	return newPool(t, sims, pool.Options{}, opts)
}

// newPool is a pool over sims, named gpu0, gpu1, ..., closed (cleanly) at
// the end of the test.
func newPool(t *testing.T, sims []*vramguardtest.Server, po pool.Options, opts vramguard.Options) *pool.Pool {
	t.Helper()
	for i, s := range sims {
		po.Members = append(po.Members, pool.Member{Name: []string{"gpu0", "gpu1", "gpu2"}[i], Host: s.URL().String(), VRAM: s.GPU()})
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = 5 * time.Millisecond
	}
	if po.ProbeInterval == 0 {
		po.ProbeInterval = 20 * time.Millisecond
	}
	c, err := pool.New(po, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return c
}

// placedGen is a generation through a pool and where it went.
type placedGen struct {
	*vramguard.Generation
	Placement pool.Placement
}

// gen generates on model through p and returns where the call went, as
// pool.WithPlacements records it.
func gen(ctx context.Context, p *pool.Pool, model string) (placedGen, error) {
	ctx, placed := pool.WithPlacements(ctx)
	g, err := p.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: model, Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil)
	if err != nil {
		return placedGen{}, err
	}
	ps := placed()
	if len(ps) != 1 {
		return placedGen{}, fmt.Errorf("generation on %s: %d placements recorded; want 1", model, len(ps))
	}
	return placedGen{g, ps[0]}, nil
}

func poolGen(t *testing.T, p *pool.Pool, model string) placedGen {
	t.Helper()
	g, err := gen(t.Context(), p, model)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

const gib = 1 << 30

func newSim(t testing.TB, cfg vramguardtest.Config, models ...vramguardtest.ModelConfig) *vramguardtest.Server {
	t.Helper()
	cfg.Models = append(cfg.Models, models...)
	s := vramguardtest.New(cfg)
	t.Cleanup(s.Close)
	return s
}

func loadOn(t *testing.T, s *vramguardtest.Server, model string) {
	t.Helper()
	if err := s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: model, Prompt: "x", KeepAlive: &api.Duration{Duration: -1}},
		func(api.GenerateResponse) error { return nil }); err != nil {
		t.Fatal(err)
	}
}

// Placement follows the facts, in order: the warm member, then the one
// with the most room, then making room where it costs least, then a
// refusal that names each device's free bytes and holders.
func TestPoolPlacement(t *testing.T) {
	t.Run("warm first", func(t *testing.T) {
		sims := poolSims(t, 16*gib, 24*gib)
		loadOn(t, sims[0], "a") // another program loaded a on the smaller device
		c := newTestPool(t, sims, vramguard.Options{})
		g := poolGen(t, c, "a")
		if p := g.Placement; p.Member != "gpu0" || p.Reason != pool.PlaceWarm || g.Loaded {
			t.Errorf("placement %+v, loaded %v; want a reuse on gpu0, where it was warm", p, g.Loaded)
		}
	})
	t.Run("most room, then warm", func(t *testing.T) {
		sims := poolSims(t, 16*gib, 24*gib)
		c := newTestPool(t, sims, vramguard.Options{})
		g := poolGen(t, c, "b")
		if p := g.Placement; p.Member != "gpu1" || p.Reason != pool.PlaceRoom || p.Free != 24*gib || p.Need == 0 {
			t.Errorf("placement %+v; want gpu1 (24 GiB free) for room", p)
		}
		g = poolGen(t, c, "a")
		if p := g.Placement; p.Member != "gpu1" || p.Reason != pool.PlaceRoom {
			t.Errorf("a: placement %+v; want gpu1 (19 GiB free, gpu0 16)", p)
		}
		g = poolGen(t, c, "b")
		if p := g.Placement; p.Member != "gpu1" || p.Reason != pool.PlaceWarm || g.Loaded {
			t.Errorf("b again: placement %+v, loaded %v; want warm on gpu1", p, g.Loaded)
		}
		if sims[0].Loads("b") != 0 || sims[1].Loads("b") != 1 {
			t.Errorf("b loaded %d times on gpu0 and %d on gpu1; want once, on gpu1", sims[0].Loads("b"), sims[1].Loads("b"))
		}
	})
	t.Run("make room where it costs least", func(t *testing.T) {
		sims := poolSims(t, 12*gib, 12*gib)
		loadOn(t, sims[0], "b") // 5 GiB to reload on gpu0
		loadOn(t, sims[1], "a") // 3 GiB on gpu1
		if err := sims[1].Reserve("comfyui", 2*gib); err != nil {
			t.Fatal(err)
		}
		c := newTestPool(t, sims, vramguard.Options{})
		g := poolGen(t, c, "c") // 9 GiB and more: room on neither (7 GiB free on each)
		if p := g.Placement; p.Member != "gpu1" || p.Reason != pool.PlaceMadeRoom || !slices.Equal(p.Evicted, []string{"a:latest"}) {
			t.Fatalf("placement %+v; want gpu1 with a unloaded (3 GiB, not b's 5)", p)
		}
		if !sims[0].Listed("b") || sims[1].Listed("a") {
			t.Errorf("b listed on gpu0 %v, a on gpu1 %v; want b kept, a gone", sims[0].Listed("b"), sims[1].Listed("a"))
		}
	})
	t.Run("protected models stay; refusal names holders", func(t *testing.T) {
		sims := poolSims(t, 10*gib, 10*gib)
		loadOn(t, sims[0], "b")
		loadOn(t, sims[1], "b")
		c := newTestPool(t, sims, vramguard.Options{Protected: []string{"b"}})
		_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "c", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		var pe *pool.NoRoomError
		var re *vramguard.RoomError
		if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.As(err, &pe) || !errors.As(err, &re) || !errors.Is(err, vramguard.ErrProtected) {
			t.Fatalf("GenerateStreaming = %v; want KindOutOfMemory with a *NoRoomError whose sides' *RoomError names the protected model", err)
		}
		if len(pe.Members) != 2 || pe.Members[0].Member != "gpu0" || pe.Members[1].Member != "gpu1" {
			t.Fatalf("NoRoomError sides %+v; want both members", pe.Members)
		}
		if msg := err.Error(); strings.Contains(msg, pool.Host) || strings.Contains(msg, "vramguard-pool") || !strings.HasPrefix(msg, `vramguard: generate "c": out of memory: c needs`) {
			t.Errorf("message %q: want the call's error naming the need, without the pool's made-up URL", msg)
		}
		for _, m := range pe.Members {
			if m.Free != 5*gib || m.Room == nil || len(m.Room.Kept) != 1 || !m.Room.Kept[0].Protected || len(m.Holders) == 0 || m.Holders[0].Name != "b:latest" {
				t.Errorf("member %+v; want 5 GiB free, b kept as protected and named as holder", m)
			}
		}
		if sims[0].Requests("c")+sims[1].Requests("c") != 0 {
			t.Error("the refused load reached a server")
		}
	})
}

// A phase keeps each model on its member; UnloadAll and Close leave no
// model on any member, verified.
func TestPoolPhaseAndLifecycle(t *testing.T) {
	sims := poolSims(t, 8*gib, 8*gib)
	var placed []string
	c := newPool(t, sims, pool.Options{OnPlace: func(_ context.Context, p pool.Placement) {
		placed = append(placed, p.Model+"@"+p.Member+":"+string(p.Reason))
	}}, vramguard.Options{})
	p, err := c.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g := p.Guard()
	for range 3 {
		for _, m := range []string{"b", "a"} { // 5 + 3 GiB: one per device
			if err := g.Run(t.Context(), m, func(ctx context.Context, s *vramguard.Session) error {
				_, err := s.Generate(ctx, &vramguard.GenerateRequest{Prompt: "x"}, nil)
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := p.End(t.Context()); err != nil {
		t.Fatal(err)
	}
	loads := sims[0].Loads("a") + sims[0].Loads("b") + sims[1].Loads("a") + sims[1].Loads("b")
	if loads != 2 {
		t.Errorf("%d loads across the pool; want 2 (each model once, kept on its member)", loads)
	}
	if len(placed) != 6 || placed[0] != "b@gpu0:room" || placed[1] != "a@gpu1:room" || placed[2] != "b@gpu0:warm" {
		t.Errorf("placements %q; want b and a placed by room, then warm on the same members", placed)
	}
	for i, s := range sims {
		if rs := s.Running(); len(rs) != 0 {
			t.Errorf("gpu%d still runs %+v after Phase.End", i, rs)
		}
	}
	poolGen(t, c, "a")
	poolGen(t, c, "b")
	reps, err := c.UnloadAll(t.Context())
	if err != nil || len(reps) != 2 {
		t.Fatalf("UnloadAll = %d reports, %v; want 2", len(reps), err)
	}
	for _, r := range reps {
		if !r.Verified {
			t.Errorf("%s: not verified", r.Model)
		}
	}
	for i, s := range sims {
		if rs := s.Running(); len(rs) != 0 {
			t.Errorf("gpu%d still runs %+v after UnloadAll", i, rs)
		}
	}
}

// switchProxy forwards TCP to a server while up; down closes its
// listener and cuts every connection, as a server that stopped would.
type switchProxy struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  map[net.Conn]bool
	wg     sync.WaitGroup
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	p := &switchProxy{t: t, target: target, conns: map[net.Conn]bool{}}
	p.up()
	t.Cleanup(func() { p.down(); p.wg.Wait() })
	return p
}

func (p *switchProxy) up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	addr := p.addr
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.ln, p.addr = ln, ln.Addr().String()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns[c], p.conns[u] = true, true
			p.mu.Unlock()
			p.wg.Add(2)
			go func() { defer p.wg.Done(); _, _ = io.Copy(u, c); u.Close() }()
			go func() { defer p.wg.Done(); _, _ = io.Copy(c, u); c.Close() }()
		}
	}()
}

func (p *switchProxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
	}
	clear(p.conns)
}

// A member that stops answering is skipped for new work, its models count
// as resident (an unload of one is not claimed verified), and it is used
// again once it answers, re-learned from its listing after a restart that
// lost its models. EnsureFree works on one member's device.
func TestPoolMemberDownAndBack(t *testing.T) {
	sims := poolSims(t, 24*gib, 16*gib)
	px := newSwitchProxy(t, sims[0].URL().Host)
	ms := []pool.Member{
		{Name: "gpu0", Host: "http://" + px.addr, VRAM: sims[0].GPU()},
		{Name: "gpu1", Host: sims[1].URL().String(), VRAM: sims[1].GPU()},
	}
	c, err := pool.New(pool.Options{Members: ms, ProbeInterval: 10 * time.Millisecond},
		vramguard.Options{PollInterval: 5 * time.Millisecond, UnloadTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := poolGen(t, c, "a").Placement; p.Member != "gpu0" {
		t.Fatalf("a on %s; want gpu0 (most room)", p.Member)
	}
	px.down()
	if p := poolGen(t, c, "b").Placement; p.Member != "gpu1" {
		t.Errorf("b on %s with gpu0 down; want gpu1", p.Member)
	}
	if st := c.Members(); st[0].Up || !slices.Contains(st[0].Models, "a:latest") || !st[1].Up {
		t.Errorf("members %+v; want gpu0 down, still counted as holding a, and gpu1 up", st)
	}
	rep, err := c.UnloadModel(t.Context(), "a")
	var me *pool.MemberError
	if !errors.Is(err, vramguard.KindUnavailable) || !errors.As(err, &me) || me.Member != "gpu0" || !errors.Is(err, pool.ErrUnreachable) || rep == nil || rep.Verified {
		t.Errorf("UnloadModel of a model on a member that does not answer = %+v, %v; want KindUnavailable naming gpu0, not a verified unload", rep, err)
	}
	if rep != nil && rep.Attempts != 0 {
		t.Errorf("%d unload attempts counted; want none: gpu0 did not hear it", rep.Attempts)
	}
	sims[0].Restart() // it comes back without a
	px.up()
	for !c.Members()[0].Up { // the next call that needs the members asks gpu0 again
		if _, err := c.Running(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := sleepCtx(t.Context(), 10*time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	g := poolGen(t, c, "a")
	if g.Placement.Member != "gpu0" || g.Placement.Reason != pool.PlaceRoom || !g.Loaded {
		t.Errorf("a back on gpu0: %+v, loaded %v; want a load by room (its old runner is gone)", g.Placement, g.Loaded)
	}
	dev, ok := c.Device("gpu1")
	if !ok || dev != 1 {
		t.Fatalf("Device(gpu1) = %d, %v; want 1", dev, ok)
	}
	if _, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Device: dev, Bytes: 14 * gib}); err != nil {
		t.Fatalf("EnsureFree on gpu1: %v", err)
	}
	if sims[1].Listed("b") || !sims[0].Listed("a") {
		t.Errorf("EnsureFree on gpu1: b listed %v, a on gpu0 listed %v; want b gone, a kept", sims[1].Listed("b"), sims[0].Listed("a"))
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	for i, s := range sims {
		if rs := s.Running(); len(rs) != 0 {
			t.Errorf("gpu%d still runs %+v after Close", i, rs)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(d):
		return nil
	}
}

// A model whose load is in flight on a member when the member stops
// answering still counts as resident there, even when a listing of the
// member was read during the load (Ollama lists a model only once its
// load ends): an unload of it is not reported verified.
func TestPoolLoadInFlightWhenMemberGoesDown(t *testing.T) {
	slow := newSim(t, vramguardtest.Config{TotalVRAM: 24 * gib, StrictVRAM: true},
		vramguardtest.ModelConfig{Name: "a", SizeVRAM: 3 * gib, LoadLatency: 300 * time.Millisecond},
		vramguardtest.ModelConfig{Name: "b", SizeVRAM: 5 * gib, LoadLatency: 20 * time.Millisecond})
	other := poolSims(t, 16*gib)[0]
	px := newSwitchProxy(t, slow.URL().Host)
	ms := []pool.Member{
		{Name: "gpu0", Host: "http://" + px.addr, VRAM: slow.GPU()},
		{Name: "gpu1", Host: other.URL().String(), VRAM: other.GPU()},
	}
	c, err := pool.New(pool.Options{Members: ms, ProbeInterval: time.Hour},
		vramguard.Options{PollInterval: 5 * time.Millisecond, UnloadTimeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil)
		done <- err
	}()
	for c.Members()[0].InFlight["a:latest"] == 0 {
		if err := sleepCtx(t.Context(), time.Millisecond); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Running(t.Context()); err != nil { // gpu0 lists nothing yet: a is loading
		t.Fatal(err)
	}
	px.down()
	if err := <-done; err == nil {
		t.Fatal("the generation through a member that stopped answering succeeded")
	}
	if st := c.Members(); !slices.Contains(st[0].Models, "a:latest") {
		t.Errorf("members %+v; want a counted on gpu0, where its load was in flight", st)
	}
	if rep, err := c.UnloadModel(t.Context(), "a"); !errors.Is(err, pool.ErrUnreachable) || !errors.Is(err, vramguard.KindUnavailable) || rep == nil || rep.Verified {
		t.Errorf("UnloadModel of a model loading on a member that stopped answering = %+v, %v; want KindUnavailable, ErrUnreachable, unverified", rep, err)
	}
}

// A member's own http.Client is used as a client: one without a Transport
// (the default one then) and with a Timeout, as Options.HTTPClient may be.
func TestPoolMemberHTTPClient(t *testing.T) {
	sims := poolSims(t, 16*gib)
	c, err := pool.New(pool.Options{Members: []pool.Member{
		{Name: "gpu0", Host: sims[0].URL().String(), VRAM: sims[0].GPU(), HTTPClient: &http.Client{Timeout: time.Minute}},
	}}, vramguard.Options{PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if p := poolGen(t, c, "a").Placement; p.Member != "gpu0" {
		t.Errorf("placement %+v; want gpu0", p)
	}
	if _, err := c.UnloadAll(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// An unload of a model no member has fails with KindNotFound, as it does
// on one server (each member answers 404), instead of passing for a
// verified unload.
func TestPoolUnloadUnknownModel(t *testing.T) {
	sims := poolSims(t, 16*gib, 16*gib)
	one := vramguardtest.NewClient(t, sims[0], vramguard.Options{})
	_, want := one.UnloadModel(t.Context(), "nope")
	c := newTestPool(t, sims, vramguard.Options{})
	rep, err := c.UnloadModel(t.Context(), "nope")
	if !errors.Is(want, vramguard.KindNotFound) || !errors.Is(err, vramguard.KindNotFound) {
		t.Errorf("UnloadModel of a model no member has = %+v, %v; want KindNotFound, as one server gives (%v)", rep, err, want)
	}
}

// Calls on one model that arrive together are placed on one member, the
// later ones warm behind the first one's load, which the member does not
// list yet: one load in the pool.
func TestPoolConcurrentCallsShareAMember(t *testing.T) {
	sims := poolSims(t, 16*gib, 16*gib)
	c := newTestPool(t, sims, vramguard.Options{})
	var wg sync.WaitGroup
	members := make([]string, 4)
	for i := range members {
		wg.Go(func() {
			g, err := gen(t.Context(), c, "b")
			if err != nil {
				t.Error(err)
				return
			}
			members[i] = g.Placement.Member
		})
	}
	wg.Wait()
	if members[0] == "" || slices.ContainsFunc(members, func(m string) bool { return m != members[0] }) {
		t.Errorf("members %q; want one member for all", members)
	}
	if n := sims[0].Loads("b") + sims[1].Loads("b"); n != 1 {
		t.Errorf("%d loads of b in the pool; want 1", n)
	}
}

// Room-making on a member is the client's own EnsureFree: its unload hooks
// see it (cause ensure free, the pool's address), and the evicted model's
// next load names it (ReloadEvicted).
func TestPoolEvictionReported(t *testing.T) {
	sims := poolSims(t, 12*gib, 12*gib)
	var mu sync.Mutex
	var starts []vramguard.UnloadStart
	var verified []string
	c := newTestPool(t, sims, vramguard.Options{Hooks: vramguard.Hooks{
		OnUnloadStart: func(ctx context.Context, u vramguard.UnloadStart) context.Context {
			mu.Lock()
			defer mu.Unlock()
			starts = append(starts, u)
			return ctx
		},
		OnUnloadEnd: func(_ context.Context, e vramguard.UnloadEnd) {
			mu.Lock()
			defer mu.Unlock()
			if e.Err == nil && e.Report.Verified {
				verified = append(verified, e.Model)
			}
		},
	}})
	poolGen(t, c, "b") // gpu0
	poolGen(t, c, "a") // gpu1, the most room
	if err := sims[1].Reserve("comfyui", 2*gib); err != nil {
		t.Fatal(err)
	}
	if p := poolGen(t, c, "c").Placement; p.Member != "gpu1" || !slices.Equal(p.Evicted, []string{"a:latest"}) {
		t.Fatalf("c: %+v; want room made on gpu1 by unloading a", p)
	}
	mu.Lock()
	if len(starts) != 1 || starts[0].Cause != vramguard.CauseEnsureFree || starts[0].Server != c.Host() || starts[0].Model != "a:latest" || len(verified) != 1 {
		t.Errorf("unload hooks saw %+v (verified %q); want one eviction of a with cause ensure free on the pool's address", starts, verified)
	}
	mu.Unlock()
	g := poolGen(t, c, "a")
	if r := g.Reload; r == nil || r.Cause != vramguard.ReloadUnloaded || r.Unload != vramguard.CauseEnsureFree {
		t.Errorf("a loaded again: reload %+v; want ReloadUnloaded by the placement's CauseEnsureFree", r)
	}
}

// A model warm on two members (another program loaded it on both) is
// used on the one with more free memory, which the placement reports.
func TestPoolWarmOnTwoMembers(t *testing.T) {
	sims := poolSims(t, 16*gib, 24*gib)
	loadOn(t, sims[0], "a")
	loadOn(t, sims[1], "a")
	c := newTestPool(t, sims, vramguard.Options{})
	g := poolGen(t, c, "a")
	if p := g.Placement; p.Member != "gpu1" || p.Reason != pool.PlaceWarm || p.Free != 21*gib || g.Loaded {
		t.Errorf("placement %+v, loaded %v; want a reuse on gpu1 (21 GiB free, gpu0 13)", p, g.Loaded)
	}
	if _, err := c.UnloadAll(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A member whose server accepts connections and never answers does not
// stall the pool: after PoolOptions.AnswerTimeout it counts as down, the
// call goes to another member, and the refusal of a call no other member
// can take says so.
func TestPoolHungMember(t *testing.T) {
	sims := poolSims(t, 8*gib)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held []net.Conn
	var mu sync.Mutex
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c) // read nothing, answer nothing
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			c.Close()
		}
	})
	hung := newSim(t, vramguardtest.Config{TotalVRAM: 24 * gib})
	ms := []pool.Member{
		{Name: "hung", Host: "http://" + ln.Addr().String(), VRAM: hung.GPU()},
		{Name: "gpu1", Host: sims[0].URL().String(), VRAM: sims[0].GPU()},
	}
	const answer = 200 * time.Millisecond
	c, err := pool.New(pool.Options{Members: ms, AnswerTimeout: answer, ProbeInterval: time.Hour},
		vramguard.Options{PollInterval: 5 * time.Millisecond, UnloadTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A listing is bounded by the answer timeout too: the hung member is
	// counted down, and the other member's listing answers (a bound a hang
	// would hold the call to: the test's own deadline).
	if _, err := c.Running(t.Context()); err != nil {
		t.Fatalf("Running with a hung member: %v; want gpu1's listing", err)
	}
	if st := c.Members(); st[0].Up {
		t.Errorf("after a listing, the hung member is up: %+v", st[0])
	}
	// An unload of a model no member holds: gpu1 refuses it (404); the hung
	// member, which holds nothing, does not turn that into "no member answers".
	if _, err := c.UnloadModel(t.Context(), "nope"); !errors.Is(err, vramguard.KindNotFound) {
		t.Errorf("UnloadModel of a model nobody has, a member down = %v; want KindNotFound", err)
	}
	g := poolGen(t, c, "a")
	if g.Placement.Member != "gpu1" {
		t.Errorf("a on %s; want gpu1, the member that answers", g.Placement.Member)
	}
	if st := c.Members(); st[0].Up {
		t.Errorf("the hung member is up: %+v", st[0])
	}
	_, err = c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "c", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	var pe *pool.NoRoomError
	var me *pool.MemberError
	if !errors.As(err, &pe) || len(pe.Members) != 2 || !errors.As(pe.Members[0].Err, &me) || me.Member != "hung" || !errors.Is(pe.Members[0].Err, pool.ErrUnreachable) {
		t.Errorf("c (9 GiB, room on no member that answers) = %v; want a *NoRoomError naming the hung member unreachable", err)
	}
	if _, err := c.UnloadModel(t.Context(), "a"); err != nil {
		t.Errorf("UnloadModel(a) = %v", err)
	}
}

// Room-making spares the pool's own phase's models while another member's
// room can be made: the phase's model stays warm on its member, even when
// unloading it would cost fewer bytes.
func TestPoolRoomSparesOwnPhase(t *testing.T) {
	sims := poolSims(t, 12*gib, 12*gib)
	loadOn(t, sims[1], "b") // another program's 5 GiB on gpu1
	c := newTestPool(t, sims, vramguard.Options{})
	p, err := c.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g := p.Guard()
	run := func() {
		t.Helper()
		if err := g.Run(t.Context(), "a", func(ctx context.Context, s *vramguard.Session) error {
			_, err := s.Generate(ctx, &vramguard.GenerateRequest{Prompt: "x"}, nil)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	run() // a (3 GiB) on gpu0, the roomier
	gen := poolGen(t, c, "c")
	if pl := gen.Placement; pl.Member != "gpu1" || pl.Reason != pool.PlaceMadeRoom || !slices.Equal(pl.Evicted, []string{"b:latest"}) {
		t.Errorf("c: placement %+v; want room made on gpu1 (b, 5 GiB), not on gpu0 by unloading the phase's a (3 GiB)", pl)
	}
	run()
	if n := sims[0].Loads("a"); n != 1 {
		t.Errorf("a loaded %d times on gpu0; want once: the phase kept it", n)
	}
	if _, err := p.End(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// New refuses, typed, what it cannot honour: no members, a member without
// a device reader or with a negative device, two members of one name,
// options that belong to the members, negative durations. Device names
// only members.
func TestPoolRefusesBadInput(t *testing.T) {
	s := newSim(t, vramguardtest.Config{})
	ok := pool.Member{Name: "gpu0", Host: s.URL().String(), VRAM: s.GPU()}
	for _, tc := range []struct {
		name string
		p    pool.Options
		o    vramguard.Options
	}{
		{"no members", pool.Options{}, vramguard.Options{}},
		{"no reader", pool.Options{Members: []pool.Member{{Host: s.URL().String()}}}, vramguard.Options{}},
		{"negative device", pool.Options{Members: []pool.Member{{Host: s.URL().String(), VRAM: s.GPU(), Device: -1}}}, vramguard.Options{}},
		{"one name twice", pool.Options{Members: []pool.Member{ok, ok}}, vramguard.Options{}},
		{"a host of its own", pool.Options{Members: []pool.Member{ok}}, vramguard.Options{Host: s.URL().String()}},
		{"a budget", pool.Options{Members: []pool.Member{ok}}, vramguard.Options{Budget: &vramguard.Budget{}}},
		{"the fallback", pool.Options{Members: []pool.Member{ok}}, vramguard.Options{Fallback: true}},
		{"negative probe interval", pool.Options{Members: []pool.Member{ok}, ProbeInterval: -time.Second}, vramguard.Options{}},
		{"negative answer timeout", pool.Options{Members: []pool.Member{ok}, AnswerTimeout: -time.Second}, vramguard.Options{}},
		{"a bad member host", pool.Options{Members: []pool.Member{{Host: "ftp://x", VRAM: s.GPU()}}}, vramguard.Options{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := pool.New(tc.p, tc.o)
			if !errors.Is(err, vramguard.KindInvalidInput) || c != nil {
				t.Errorf("New = %v, %v; want KindInvalidInput and no pool", c, err)
			}
		})
	}
	p := newTestPool(t, []*vramguardtest.Server{s}, vramguard.Options{})
	if d, ok := p.Device("nope"); ok {
		t.Errorf("Device(nope) = %d, true; want false", d)
	}
}

// Room-making honours another program's pool's leases: they name the
// pool's address, not the member's.
func TestPoolKeepsOtherPoolsLease(t *testing.T) {
	sims := poolSims(t, 12*gib, 12*gib)
	dir := filepath.Join(t.TempDir(), "leases")
	p1 := newTestPool(t, sims, vramguard.Options{Leases: vramguard.LeaseOptions{Dir: dir}})
	if pl := poolGen(t, p1, "a").Placement; pl.Member != "gpu0" {
		t.Fatalf("a on %s; want gpu0", pl.Member)
	}
	l, err := p1.HoldModel(t.Context(), "a", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	loadOn(t, sims[1], "b")
	p2 := newTestPool(t, sims, vramguard.Options{Leases: vramguard.LeaseOptions{Dir: dir}})
	pl := poolGen(t, p2, "c")
	if slices.Contains(pl.Placement.Evicted, "a:latest") || !sims[0].Listed("a") {
		t.Errorf("placement %+v: unloaded a, which another program's pool leases", pl.Placement)
	}
}

// A caller waiting behind another call's placement gives up when its own
// context ends.
func TestPoolPlacementWaitHonoursContext(t *testing.T) {
	sims := poolSims(t, 16*gib, 16*gib)
	release := make(chan struct{})
	hung := hungGPU{VRAMReader: sims[1].GPU(), release: release}
	ms := []pool.Member{{Name: "gpu0", Host: sims[0].URL().String(), VRAM: sims[0].GPU()},
		{Name: "gpu1", Host: sims[1].URL().String(), VRAM: hung}}
	c, err := pool.New(pool.Options{Members: ms, AnswerTimeout: time.Hour}, vramguard.Options{PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	first := make(chan error, 1)
	go func() {
		_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		first <- err
	}()
	<-hung.reading() // the first placement is in progress, its survey blocked
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "b", Prompt: "x"}, vramguard.KeepAliveUnload, nil); !errors.Is(err, vramguard.KindCanceled) {
		t.Errorf("a call canceled while waiting for a placement = %v; want KindCanceled", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Errorf("the first call: %v", err)
	}
}

// hungGPU blocks every snapshot until release is closed; reading reports
// the first snapshot begun.
type hungGPU struct {
	vramguard.VRAMReader
	release chan struct{}
}

var hungReads sync.Map // release channel → chan struct{} closed at the first read

func (h hungGPU) reading() chan struct{} {
	ch, _ := hungReads.LoadOrStore(h.release, make(chan struct{}))
	return ch.(chan struct{})
}

func (h hungGPU) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	ch := h.reading()
	select {
	case <-ch:
	default:
		close(ch)
	}
	select {
	case <-h.release:
		return h.VRAMReader.Snapshot(ctx)
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

// A pool's runner check looks for its members' servers: with a member on
// another machine it is not made and the report names that member; with
// local members it is tied to their listening servers (real ones in
// internal/suites/integration, TestPoolPlacementOnRealServers).
func TestPoolRemoteMemberChecksNoRunners(t *testing.T) {
	s := newSim(t, vramguardtest.Config{}, vramguardtest.ModelConfig{Name: "a"})
	// A name that is not local to the library, dialled to the simulator.
	tr := &http.Transport{DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, s.URL().Host)
	}}
	t.Cleanup(tr.CloseIdleConnections)
	far := pool.Member{Name: "far", Host: "http://gpu-box.example:11434", VRAM: s.GPU(), HTTPClient: &http.Client{Transport: tr}}
	rp, err := pool.New(pool.Options{Members: []pool.Member{far}},
		vramguard.Options{PollInterval: 5 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer rp.Close()
	if _, err := rp.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		t.Fatal(err)
	}
	rep, err := rp.UnloadModel(t.Context(), "a")
	if err != nil {
		t.Fatal(err)
	}
	if rep.NoRunnerCheck != "remote server http://gpu-box.example:11434" || rep.Checked&vramguard.CheckRunnerProcesses != 0 || !rep.Verified {
		t.Errorf("report %+v; want verified by the listing, the runner check named as not made for the remote member", rep)
	}
	// Members on this machine: the check looks for their servers (the
	// simulators are no `ollama serve`, and the report says so).
	sims := poolSims(t, 8*gib)
	lp := newTestPool(t, sims, vramguard.Options{})
	poolGen(t, lp, "a")
	rep, err = lp.UnloadModel(t.Context(), "a")
	if err != nil || !rep.Verified || strings.HasPrefix(rep.NoRunnerCheck, "remote server") || rep.NoRunnerCheck == "" {
		t.Errorf("local pool: report %+v, %v; want the runner check tied to the member's listening server, not made for a simulator", rep, err)
	}
}

// TestPoolEnsureFreeNamesMember: EnsureFree on a pool works on the
// member's device in the pool's numbering (each server's own device is
// its device 0), and its refusal names that device and its holders.
func TestPoolEnsureFreeNamesMember(t *testing.T) {
	sims := poolSims(t, 10*gib, 10*gib)
	if err := sims[1].Reserve("comfyui", 8*gib); err != nil {
		t.Fatal(err)
	}
	c := newTestPool(t, sims, vramguard.Options{})
	_, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Device: 1, Bytes: 5 * gib})
	var re *vramguard.RoomError
	if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.As(err, &re) || re.Device != 1 || !strings.Contains(err.Error(), "comfyui") {
		t.Errorf("EnsureFree on gpu1 = %v; want KindOutOfMemory naming device 1 and comfyui", err)
	}
}

// Placements that make room through the pool client's own unloads, many at
// once, cannot deadlock: the turn a placement holds is taken by none of
// the requests its room-making sends, and the models other calls run on
// when the plan is made are kept (KeepInUse). Every call ends, with a
// result or a typed refusal, well within the test's bound; a deadlock
// would hold them to it. (A call on a planned victim begun after the plan
// goes on after it: TestPoolCallOnAPlannedVictimDoesNotStall.)
func TestPoolPlacementsMakingRoomDoNotDeadlock(t *testing.T) {
	sims := poolSims(t, 12*gib, 12*gib)
	// Another program's c (9 GiB) on both devices: the first placement of a
	// or b must make room, whatever the order the calls arrive in.
	loadOn(t, sims[0], "c")
	loadOn(t, sims[1], "c")
	c := newTestPool(t, sims, vramguard.Options{UnloadTimeout: 5 * time.Second})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	made := 0
	for i := range 12 {
		wg.Go(func() {
			model := []string{"a", "b"}[i%2] // b (5 GiB) fits beside c on neither device: its room is made
			g, err := gen(ctx, c, model)
			if ctx.Err() != nil {
				t.Errorf("call %d on %s still waiting at the bound: %v", i, model, err)
				return
			}
			var pe *pool.NoRoomError
			if err != nil && !errors.As(err, &pe) {
				t.Errorf("call %d on %s: %v; want a result or a *NoRoomError", i, model, err)
				return
			}
			if err == nil && g.Placement.Reason == pool.PlaceMadeRoom {
				mu.Lock()
				made++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if made == 0 {
		t.Error("no placement made room: the test did not exercise room-making")
	}
}

// UnloadAll on a pool with one member stopped costs that member one failed
// answer, not a retry loop to the unload timeout: the model there is
// reported once, unverified, with a *MemberError naming the member; the
// other member's model is unloaded, verified.
func TestPoolUnloadAllWithMemberStopped(t *testing.T) {
	sims := poolSims(t, 24*gib, 16*gib)
	px := newSwitchProxy(t, sims[0].URL().Host)
	c, err := pool.New(pool.Options{Members: []pool.Member{
		{Name: "gpu0", Host: "http://" + px.addr, VRAM: sims[0].GPU()},
		{Name: "gpu1", Host: sims[1].URL().String(), VRAM: sims[1].GPU()},
	}, ProbeInterval: time.Hour}, vramguard.Options{PollInterval: 5 * time.Millisecond, UnloadTimeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if g := poolGen(t, c, "b"); g.Placement.Member != "gpu0" {
		t.Fatalf("b on %s; want gpu0", g.Placement.Member)
	}
	if g := poolGen(t, c, "a"); g.Placement.Member != "gpu0" {
		t.Fatalf("a on %s; want gpu0 (19 GiB free, gpu1 16)", g.Placement.Member)
	}
	loadOn(t, sims[1], "c")
	px.down()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // far below the hour a retry loop would take
	defer cancel()
	reps, err := c.UnloadAll(ctx)
	if ctx.Err() != nil {
		t.Fatalf("UnloadAll waited to the test's bound: %v", err)
	}
	var me *pool.MemberError
	if !errors.As(err, &me) || me.Member != "gpu0" || !errors.Is(err, pool.ErrUnreachable) {
		t.Errorf("UnloadAll error %v; want a *MemberError naming gpu0", err)
	}
	got := map[string]bool{}
	for _, r := range reps {
		if got[r.Model] {
			t.Errorf("%s reported twice", r.Model)
		}
		got[r.Model] = r.Verified
	}
	if v, ok := got["c:latest"]; !ok || !v || sims[1].Listed("c") {
		t.Errorf("reports %+v: want c, on gpu1, unloaded, verified", reps)
	}
	for _, m := range []string{"a:latest", "b:latest"} {
		if v, ok := got[m]; !ok || v {
			t.Errorf("reports %+v: want %s reported once, unverified", reps, m)
		}
	}
	if n := strings.Count(err.Error(), "pool member gpu0"); n != 2 {
		t.Errorf("error %q names gpu0 %d times; want once per model on it (2)", err, n)
	}
}

// A phase on a pool hands over verified-free memory on the member it used
// (PhaseOptions.Device from Pool.Device), leaving the other member's
// model, and a second phase of the same client that keeps its model on
// the other member, alone.
func TestPoolPhaseHandOverOnItsMember(t *testing.T) {
	sims := poolSims(t, 12*gib, 12*gib)
	c := newTestPool(t, sims, vramguard.Options{})
	run := func(ph *vramguard.Phase, model string) pool.Placement {
		t.Helper()
		ctx, placed := pool.WithPlacements(t.Context())
		g := ph.Guard()
		if err := g.Run(ctx, model, func(ctx context.Context, s *vramguard.Session) error {
			_, err := s.Generate(ctx, &vramguard.GenerateRequest{Prompt: "x"}, nil)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		ps := placed()
		if len(ps) != 1 {
			t.Fatalf("%d placements for one step", len(ps))
		}
		return ps[0]
	}
	other, err := c.StartPhase(t.Context(), "negatives", vramguard.PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pl := run(other, "b"); pl.Member != "gpu0" {
		t.Fatalf("b on %s; want gpu0 (the first of two equal members)", pl.Member)
	}
	dev, _ := c.Device("gpu1")
	ph, err := c.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{NeedBytes: 11 * gib, Device: dev})
	if err != nil {
		t.Fatalf("StartPhase with NeedBytes on a pool: %v", err)
	}
	if pl := run(ph, "a"); pl.Member != "gpu1" {
		t.Fatalf("a on %s; want gpu1 (room: gpu0 holds b)", pl.Member)
	}
	rep, err := ph.End(t.Context())
	if err != nil {
		t.Fatalf("End: %v", err)
	}
	if rep.Handover == nil || rep.Handover.FreeAfter < 11*gib {
		t.Errorf("hand-over %+v; want 11 GiB free on gpu1, measured", rep.Handover)
	}
	if sims[1].Listed("a") || !sims[0].Listed("b") {
		t.Errorf("after End: a on gpu1 %v, b on gpu0 %v; want a gone, b kept for the other phase", sims[1].Listed("a"), sims[0].Listed("b"))
	}
	if _, err := other.End(t.Context()); err != nil {
		t.Fatal(err)
	}
	if sims[0].Listed("b") {
		t.Error("b still on gpu0 after its phase ended")
	}
}

// Room-making through a pool honours the leases another program's client
// of one member takes (they name the member's address, not the pool's).
func TestPoolKeepsMemberClientsLease(t *testing.T) {
	sims := poolSims(t, 12*gib, 12*gib)
	dir := filepath.Join(t.TempDir(), "leases")
	loadOn(t, sims[0], "a")
	loadOn(t, sims[1], "b")
	direct := vramguardtest.NewClient(t, sims[1], vramguard.Options{Leases: vramguard.LeaseOptions{Dir: dir}})
	l, err := direct.HoldModel(t.Context(), "b", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	p := newTestPool(t, sims, vramguard.Options{Leases: vramguard.LeaseOptions{Dir: dir}})
	g := poolGen(t, p, "c") // 9 GiB: room on neither; b (5 GiB) would cost more than a (3 GiB) anyway, so squeeze gpu0
	if g.Placement.Member != "gpu0" || !slices.Equal(g.Placement.Evicted, []string{"a:latest"}) || !sims[1].Listed("b") {
		t.Fatalf("c: %+v; want room made on gpu0, b (leased on gpu1's address) kept", g.Placement)
	}
	if _, err := p.UnloadModel(t.Context(), "c"); err != nil {
		t.Fatal(err)
	}
	if err := sims[0].Reserve("comfyui", 4*gib); err != nil {
		t.Fatal(err)
	}
	_, err = gen(t.Context(), p, "c") // now only by unloading b, which its lease keeps
	var pe *pool.NoRoomError
	if !errors.As(err, &pe) || !errors.Is(err, vramguard.ErrLeased) || !sims[1].Listed("b") {
		t.Errorf("c with gpu0 squeezed = %v; want a *NoRoomError naming b's lease, b kept", err)
	}
}

// A call the pool refuses at its placement never reached a server: a
// guard's cleanup then has nothing to unload, and Close does not unload the
// model because of it (composition oracle seed 1796282063726130557: the
// guard's cleanup sent an unload of the refused model to both members).
func TestPoolRefusedGuardSendsNoUnload(t *testing.T) {
	sims := poolSims(t, 10*gib, 10*gib)
	loadOn(t, sims[0], "b")
	loadOn(t, sims[1], "b")
	hooks, ended := recordUnloads()
	c := newTestPool(t, sims, vramguard.Options{Protected: []string{"b"}, Hooks: hooks})
	g := vramguard.Guard{Client: c.OllamaClient}
	_, err := g.Generate(t.Context(), &vramguard.GenerateRequest{Model: "c", Prompt: "x"}, nil)
	var pe *pool.NoRoomError
	if !errors.As(err, &pe) || !errors.Is(err, vramguard.KindOutOfMemory) {
		t.Fatalf("guard on c = %v; want the pool's *NoRoomError (b, protected, fills both members)", err)
	}
	if errors.Is(err, vramguard.KindUnverified) {
		t.Errorf("guard on c = %v; want no cleanup failure joined: the refused call left nothing to clean up", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, u := range ended() {
		if vramguard.NormalizeModelName(u.Model) == "c:latest" {
			t.Errorf("unload of c (%s, %d requests sent) after a refusal at the placement; want none", u.Cause, u.Report.Attempts)
		}
	}
	if n := sims[0].Requests("c") + sims[1].Requests("c"); n != 0 {
		t.Errorf("%d requests for c reached a server; want none", n)
	}
}

// The other side of TestPoolRefusedGuardSendsNoUnload: a call whose
// request reached a member, and then failed there (here the member's
// HTTP client timed out while the model loaded and stalled), may have
// loaded the model. The guard's cleanup still unloads it, verified.
func TestPoolMemberFailureAfterSendKeepsCleanup(t *testing.T) {
	sims := poolSims(t, 10*gib)
	if err := sims[0].FailNext("a", vramguardtest.Stall(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	hooks, ended := recordUnloads()
	c := newPool(t, nil, pool.Options{Members: []pool.Member{{Name: "gpu0", Host: sims[0].URL().String(), VRAM: sims[0].GPU(),
		HTTPClient: &http.Client{Timeout: 300 * time.Millisecond}}}}, vramguard.Options{Hooks: hooks})
	g := vramguard.Guard{Client: c.OllamaClient}
	if _, err := g.Generate(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"}, nil); err == nil {
		t.Fatal("guard on a: no error; want the member's timeout")
	} else {
		t.Logf("guard on a: %v", err)
	}
	unloads := ended()
	cleaned := slices.ContainsFunc(unloads, func(e vramguard.UnloadEnd) bool {
		return vramguard.NormalizeModelName(e.Model) == "a:latest" && e.Cause == vramguard.CauseGuard
	})
	if !cleaned {
		t.Errorf("no guard cleanup of a after its request reached the member (unloads %v): the call was taken back as if never sent", unloads)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if err := sims[0].WaitFor(ctx, func() bool { return !sims[0].Listed("a") }); err != nil {
		t.Errorf("a still listed on the member: %v", err)
	}
}

// recordUnloads returns hooks that record every unload's end, and a func
// that returns those recorded so far.
func recordUnloads() (vramguard.Hooks, func() []vramguard.UnloadEnd) {
	var mu sync.Mutex
	var unloads []vramguard.UnloadEnd
	return vramguard.Hooks{OnUnloadEnd: func(_ context.Context, e vramguard.UnloadEnd) {
			mu.Lock()
			defer mu.Unlock()
			unloads = append(unloads, e)
		}}, func() []vramguard.UnloadEnd {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(unloads)
		}
}
