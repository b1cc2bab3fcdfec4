package vramguard_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// TestReleaseVRAMRunsTenants: ReleaseVRAM runs the Release of every
// registered tenant, on a device or on none, one after another in
// registration order, reports their names in Ran, and joins their
// failures (a panic included) as KindInternal; Cleanup and CleanupAsync
// with Release do the same; an unregistered tenant is run no more.
func TestReleaseVRAMRunsTenants(t *testing.T) {
	s := tenantSim(t)
	c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU()})
	o := &order{}
	register := func(tn vramguard.Tenant) (unregister func()) {
		t.Helper()
		un, err := c.RegisterTenant(tn)
		if err != nil {
			t.Fatal(err)
		}
		return un
	}
	register(vramguard.Tenant{Name: "a", Bytes: 4 * gib, First: true, Release: func(context.Context) error { o.add("a"); s.Release("a"); return nil }})
	unCache := register(vramguard.Tenant{Name: "torch cache", Device: -1, Release: func(context.Context) error { o.add("cache"); return nil }})
	register(vramguard.Tenant{Name: "b", Release: func(context.Context) error { o.add("b"); return errors.New("pool busy") }})
	register(vramguard.Tenant{Name: "c", Device: -1, Release: func(context.Context) error { o.add("c"); panic("boom") }})

	rep, err := c.ReleaseVRAM(t.Context())
	if !errors.Is(err, vramguard.KindInternal) || !strings.Contains(err.Error(), "pool busy") || !strings.Contains(err.Error(), "boom") {
		t.Fatalf("ReleaseVRAM = %v; want both failures, KindInternal", err)
	}
	if got, want := strings.Join(rep.Ran, ","), "a,torch cache,b,c"; got != want || o.String() != "a cache b c" {
		t.Errorf("ran %q (steps %q); want %q in registration order", got, o, want)
	}
	if freed := rep.After.Device(0).Free - rep.Before.Device(0).Free; freed != 4*gib {
		t.Errorf("freed %d bytes; want a's %d", freed, 4*gib)
	}

	unCache()
	unCache() // harmless
	o.steps = nil
	cr, err := c.Cleanup(t.Context(), vramguard.CleanupOptions{Release: true})
	if err == nil || cr.Release == nil || strings.Join(cr.Release.Ran, ",") != "a,b,c" {
		t.Errorf("Cleanup with Release after unregister: %+v, %v; want a, b, c run", cr.Release, err)
	}
	o.steps = nil
	cr, err = c.CleanupAsync(t.Context(), vramguard.CleanupOptions{Release: true}).Wait()
	if err == nil || cr.Release == nil || o.String() != "a b c" {
		t.Errorf("CleanupAsync with Release: %+v, %v, steps %q; want a, b, c run", cr.Release, err, o)
	}
	o.steps = nil
	if cr, err := c.Cleanup(t.Context(), vramguard.CleanupOptions{}); err != nil || cr.Release != nil || o.String() != "" {
		t.Errorf("Cleanup without Release: %+v, %v, steps %q; want nothing run", cr, err, o)
	}
	_ = c.Wait() // the async cleanup's failure, reported by Wait as well
}

// TestWhoAsksATenant is the contract of Tenant.Device, caller by caller,
// for a tenant on device 0 and one on no device (-1): room-making asks a
// tenant on its device as a step of its plan, only while the room is
// missing, and never again after its steps; a tenant on no device is never
// a step, but runs in every release step (after room-making's steps, at
// Phase.End, after a Guard's use with Release); ReleaseVRAM and Cleanup
// with Release run both. An unregistered tenant is asked by none.
func TestWhoAsksATenant(t *testing.T) {
	phase := func(opts vramguard.PhaseOptions) func(context.Context, *vramguard.OllamaClient) error {
		return func(ctx context.Context, c *vramguard.OllamaClient) error {
			p, err := c.StartPhase(ctx, "prompts", opts)
			if err != nil {
				return err
			}
			g := p.Guard()
			if _, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: "big", Prompt: "x"}, nil); err != nil {
				return err
			}
			_, err = p.End(ctx)
			return err
		}
	}
	ensure := func(need uint64) func(context.Context, *vramguard.OllamaClient) error {
		return func(ctx context.Context, c *vramguard.OllamaClient) error {
			_, err := c.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: need, Timeout: 300 * time.Millisecond})
			return err
		}
	}
	tests := []struct {
		name string
		// unregister removes the tenant before call.
		unregister bool
		call       func(context.Context, *vramguard.OllamaClient) error
		// onDevice and noDevice: how often the tenant on device 0, and
		// the one on no device, is asked.
		onDevice, noDevice int
	}{
		{name: "ReleaseVRAM", onDevice: 1, noDevice: 1, call: func(ctx context.Context, c *vramguard.OllamaClient) error {
			_, err := c.ReleaseVRAM(ctx)
			return err
		}},
		{name: "Cleanup with Release", onDevice: 1, noDevice: 1, call: func(ctx context.Context, c *vramguard.OllamaClient) error {
			_, err := c.Cleanup(ctx, vramguard.CleanupOptions{AllModels: true, Release: true})
			return err
		}},
		{name: "Cleanup without Release", call: func(ctx context.Context, c *vramguard.OllamaClient) error {
			_, err := c.Cleanup(ctx, vramguard.CleanupOptions{AllModels: true})
			return err
		}},
		// 6 GiB free; big's 8 GiB make 12: the tenant on the device is
		// not needed.
		{name: "EnsureFree, a model makes the room", noDevice: 1, call: ensure(12 * gib)},
		// 20 GiB need big and the tenant on the device; without it the
		// arithmetic refuses (6 + 8 < 20) and nothing runs.
		{name: "EnsureFree, the tenant makes the room", onDevice: 1, call: ensure(20 * gib)},
		{name: "EnsureFree, the room is there", call: ensure(gib)},
		{name: "EnsureFree dry run", call: func(ctx context.Context, c *vramguard.OllamaClient) error {
			_, err := c.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: 20 * gib, DryRun: true})
			return err
		}},
		{name: "Guard with Release", noDevice: 1, call: func(ctx context.Context, c *vramguard.OllamaClient) error {
			g := vramguard.Guard{Client: c, Release: true}
			_, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: "big", Prompt: "x"}, nil)
			return err
		}},
		{name: "Phase.End", noDevice: 1, call: phase(vramguard.PhaseOptions{})},
		// The phase's unload leaves 14 GiB: the hand-over of 20 asks the
		// tenant on the device; the one on no device, run by End's
		// cleanup, gives b's 6 GiB itself, and the hand-over has nothing
		// left to ask.
		{name: "Phase.End handing over", onDevice: 1, noDevice: 1, call: phase(vramguard.PhaseOptions{NeedBytes: 20 * gib, NoReserve: true})},
		{name: "ReleaseVRAM, unregistered", unregister: true, call: func(ctx context.Context, c *vramguard.OllamaClient) error {
			_, err := c.ReleaseVRAM(ctx)
			return err
		}},
		{name: "EnsureFree, unregistered", unregister: true, call: ensure(20 * gib)},
		{name: "Phase.End, unregistered", unregister: true, call: phase(vramguard.PhaseOptions{})},
	}
	for _, tt := range tests {
		for _, device := range []int{0, -1} {
			want := tt.onDevice
			if device < 0 {
				want = tt.noDevice
			}
			t.Run(tt.name+"/device "+map[int]string{0: "0", -1: "none"}[device], func(t *testing.T) {
				s := tenantSim(t)
				c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), VRAMPollInterval: 10 * time.Millisecond})
				var asked atomic.Int32
				tn := vramguard.Tenant{Name: "torch cache", Device: device, Release: func(context.Context) error {
					asked.Add(1)
					s.Release("b")
					return nil
				}}
				if device >= 0 {
					tn.Bytes = 6 * gib
				}
				unregister, err := c.RegisterTenant(tn)
				if err != nil {
					t.Fatal(err)
				}
				if tt.unregister {
					unregister()
				}
				err = tt.call(t.Context(), c)
				if got := int(asked.Load()); got != want {
					t.Errorf("the tenant was asked %d times (call: %v); want %d", got, err, want)
				}
			})
		}
	}
}

// TestRegisterTenantValidates: what RegisterTenant refuses, with
// KindInvalidInput, and what it takes.
func TestRegisterTenantValidates(t *testing.T) {
	nop := func(context.Context) error { return nil }
	size := func(context.Context) (uint64, error) { return gib, nil }
	c := newTestClient(t, newSim(t, vramguardtest.Config{}), vramguard.Options{})
	if _, err := c.RegisterTenant(vramguard.Tenant{Name: "taken", Release: nop}); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		tenant vramguard.Tenant
		ok     bool
	}{
		{"no name", vramguard.Tenant{Release: nop}, false},
		{"no release", vramguard.Tenant{Name: "x"}, false},
		{"name taken", vramguard.Tenant{Name: "taken", Device: -1, Release: nop}, false},
		{"device below -1", vramguard.Tenant{Name: "x", Device: -2, Release: nop}, false},
		{"over MaxBytes", vramguard.Tenant{Name: "x", Bytes: vramguard.MaxBytes + 1, Release: nop}, false},
		{"no device, with First", vramguard.Tenant{Name: "x", Device: -1, First: true, Release: nop}, false},
		{"no device, with Bytes", vramguard.Tenant{Name: "x", Device: -1, Bytes: gib, Release: nop}, false},
		{"no device, with PID", vramguard.Tenant{Name: "x", Device: -1, PID: 42, Release: nop}, false},
		{"no device, with Size", vramguard.Tenant{Name: "x", Device: -1, Size: size, Release: nop}, false},
		{"no device", vramguard.Tenant{Name: "no device", Device: -1, Release: nop}, true},
		{"device 0, size unknown", vramguard.Tenant{Name: "device 0", Release: nop}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			un, err := c.RegisterTenant(tt.tenant)
			switch {
			case tt.ok && err != nil:
				t.Fatalf("RegisterTenant = %v; want it taken", err)
			case tt.ok:
				un()
			case !errors.Is(err, vramguard.KindInvalidInput):
				t.Fatalf("RegisterTenant = %v; want KindInvalidInput", err)
			}
		})
	}
}
