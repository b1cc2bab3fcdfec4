package vramguard_test

import (
	"context"
	"reflect"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// hookCase makes one hook's event happen on a client built with hooks; the
// case fails if that hook is not called.
type hookCase struct {
	hook  string // the Hooks field
	event func(t *testing.T, hooks vramguard.Hooks)
}

// hookCases are one case per field of Hooks: TestEveryHookCalled fails for
// a field without one.
func hookCases() []hookCase {
	gen := func(t *testing.T, c *vramguard.OllamaClient, model string) {
		t.Helper()
		if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: model, Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
			t.Fatal(err)
		}
	}
	sim := func(t *testing.T) *vramguardtest.Server {
		return newSim(t, vramguardtest.Config{TotalVRAM: 16 * gib}, vramguardtest.ModelConfig{Name: "tiny", Size: gib})
	}
	call := func(t *testing.T, h vramguard.Hooks) {
		gen(t, newTestClient(t, sim(t), vramguard.Options{Hooks: h}), "tiny")
	}
	unload := func(t *testing.T, h vramguard.Hooks) {
		c := newTestClient(t, sim(t), vramguard.Options{Hooks: h})
		gen(t, c, "tiny")
		if _, err := c.UnloadModel(t.Context(), "tiny"); err != nil {
			t.Fatal(err)
		}
	}
	return []hookCase{
		{"OnCallStart", call},
		{"OnCallEnd", call},
		{"OnUnloadStart", unload},
		{"OnUnloadEnd", unload},
		{"OnAdmission", func(t *testing.T, h vramguard.Hooks) {
			s := sim(t)
			gen(t, newTestClient(t, s, vramguard.Options{Hooks: h, VRAM: s.GPU(), Budget: &vramguard.Budget{}}), "tiny")
		}},
		{"OnVRAMWait", func(t *testing.T, h vramguard.Hooks) {
			// Room is made by unloading tiny: EnsureFree waits for it.
			s := sim(t)
			c := newTestClient(t, s, vramguard.Options{Hooks: h, VRAM: s.GPU()})
			gen(t, c, "tiny")
			if err := s.Reserve("other", 14*gib+gib/2); err != nil {
				t.Fatal(err)
			}
			if _, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: gib}); err != nil {
				t.Fatal(err)
			}
		}},
		{"OnFallback", func(t *testing.T, h vramguard.Hooks) {
			s := sim(t)
			cli, _ := fakeCLI(t, `cat >/dev/null; printf 'from the cli\n'`)
			c := newTestClient(t, s, vramguard.Options{Hooks: h, Fallback: true, CLIPath: cli})
			if err := s.FailNext("tiny", vramguardtest.Busy()); err != nil {
				t.Fatal(err)
			}
			gen(t, c, "tiny")
		}},
		{"OnCleanupFailed", func(t *testing.T, h vramguard.Hooks) {
			c, err := vramguard.NewClient(vramguard.Options{Host: sim(t).URL().String(), Hooks: h, VRAM: panicReader{}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.CleanupAsync(t.Context(), vramguard.CleanupOptions{Release: true}).Wait(); err == nil {
				t.Fatal("a cleanup whose reader panics: nil error")
			}
			if err := c.Close(); err == nil { // its release panics too
				t.Fatal("Close with a reader that panics: nil error")
			}
		}},
	}
}

// hookCounter sets every hook of Hooks to count its calls by field name,
// through reflection, so that a hook added to Hooks is counted too.
type hookCounter struct {
	mu    sync.Mutex
	calls map[string]int
}

func (hc *hookCounter) hooks(t *testing.T) vramguard.Hooks {
	var h vramguard.Hooks
	v := reflect.ValueOf(&h).Elem()
	for i := range v.NumField() {
		f, name := v.Field(i), v.Type().Field(i).Name
		ft := f.Type()
		if ft.Kind() != reflect.Func || ft.NumIn() != 2 || ft.In(0) != reflect.TypeFor[context.Context]() {
			t.Fatalf("Hooks.%s is %v; every hook takes the call's context and one event", name, ft)
		}
		f.Set(reflect.MakeFunc(ft, func(args []reflect.Value) []reflect.Value {
			hc.mu.Lock()
			hc.calls[name]++
			hc.mu.Unlock()
			if ft.NumOut() == 1 {
				return []reflect.Value{args[0]} // a start hook: the context as it was
			}
			return nil
		}))
	}
	return h
}

func (hc *hookCounter) count(name string) int {
	hc.mu.Lock()
	defer hc.mu.Unlock()
	return hc.calls[name]
}

// TestEveryHookCalled (issue #35, item 4): each hook of Hooks is called
// when its event happens, alone and joined with another set (each side
// called once), and every hook has the same shape (the call's context and
// one event). A hook without a case here fails the test.
func TestEveryHookCalled(t *testing.T) {
	cases := hookCases()
	var fields []string
	ht := reflect.TypeFor[vramguard.Hooks]()
	for i := range ht.NumField() {
		fields = append(fields, ht.Field(i).Name)
	}
	for _, f := range fields {
		if !slices.ContainsFunc(cases, func(c hookCase) bool { return c.hook == f }) {
			t.Errorf("Hooks.%s has no case in hookCases: nothing shows it is called", f)
		}
	}
	for _, tc := range cases {
		t.Run(tc.hook, func(t *testing.T) {
			alone := &hookCounter{calls: map[string]int{}}
			tc.event(t, alone.hooks(t))
			if alone.count(tc.hook) == 0 {
				t.Errorf("%s was not called when its event happened (calls %v)", tc.hook, alone.calls)
			}
			a, b := &hookCounter{calls: map[string]int{}}, &hookCounter{calls: map[string]int{}}
			tc.event(t, vramguard.JoinHooks(a.hooks(t), b.hooks(t)))
			if a.count(tc.hook) != alone.count(tc.hook) || b.count(tc.hook) != alone.count(tc.hook) {
				t.Errorf("joined, %s was called %d and %d times; alone %d", tc.hook, a.count(tc.hook), b.count(tc.hook), alone.count(tc.hook))
			}
		})
	}
}
