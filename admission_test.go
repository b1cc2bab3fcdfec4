package vramguard_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// budgetSim is threeModelSim with "big" and "mid" loaded by another
// program and a diffusion model holding 12 GiB, so 2 GiB of the 24 are
// free; c has the budget b.
func budgetSim(t *testing.T, b vramguard.Budget) (*vramguardtest.Server, *vramguard.OllamaClient, *vramguard.ModelEstimate) {
	t.Helper()
	s := threeModelSim(t, vramguardtest.Config{StrictVRAM: true})
	loadForever(t, s, "big", "mid")
	if err := s.Reserve("comfyui", 8*gib); err != nil {
		t.Fatal(err)
	}
	c, _ := countedClient(t, s, vramguard.Options{VRAM: &vramguardtest.GPU{Server: s}, Budget: &b})
	est, err := c.EstimateModel(t.Context(), "small", 0)
	if err != nil {
		t.Fatal(err)
	}
	return s, c, est
}

func free(t *testing.T, s *vramguardtest.Server) uint64 {
	t.Helper()
	_, _, f := s.Memory()
	return f
}

// With MakeRoom, a load that would leave less than the headroom free first
// unloads the fewest bytes of Ollama models that make the room, then loads.
func TestBudgetMakesRoomBeforeLoad(t *testing.T) {
	const headroom = 4 * gib
	s, c, est := budgetSim(t, vramguard.Budget{Headroom: headroom, MakeRoom: true})
	if f := free(t, s); f >= uint64(est.Total)+headroom {
		t.Fatalf("%d bytes free already: the test needs a device short of room", f)
	}
	if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "small", Prompt: "x"}, vramguard.KeepAliveUnload, nil); err != nil {
		t.Fatal(err)
	}
	// About 4 GiB are missing: mid (6 GiB) makes the room with fewer
	// bytes than big (8 GiB), which the largest-first rule before #34 took.
	if !s.Listed("big") || s.Listed("mid") {
		t.Errorf("listed: big %v, mid %v; want mid (the fewest bytes) unloaded and big kept", s.Listed("big"), s.Listed("mid"))
	}
	if s.Loads("small") != 1 {
		t.Errorf("small loaded %d times, want 1", s.Loads("small"))
	}
}

// Without MakeRoom, a load past the cap is refused before anything is
// sent, with an error that names the budget, the need and the holders.
func TestBudgetRefusesNamingHolders(t *testing.T) {
	s, c, est := budgetSim(t, vramguard.Budget{MaxBytes: 15 * gib})
	_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "small", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	var be *vramguard.RoomError
	if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.Is(err, vramguard.ErrOverBudget) || !errors.As(err, &be) {
		t.Fatalf("GenerateStreaming = %v; want KindOutOfMemory wrapping a *RoomError", err)
	}
	if be.Need != uint64(est.Total) || be.Model != "small" || be.Held != 14*gib || be.Budget == nil || be.Budget.MaxBytes != 15*gib {
		t.Errorf("RoomError %+v: want the estimate, 14 GiB held by Ollama and the 15 GiB cap", be)
	}
	kinds := map[vramguard.HolderKind]int{}
	for _, h := range be.Holders {
		kinds[h.Kind]++
	}
	if kinds[vramguard.HolderRunner] != 2 || kinds[vramguard.HolderOther] != 1 || kinds[vramguard.HolderFree] != 1 {
		t.Errorf("holders %+v: want the two runners, the diffusion model and the free share", be.Holders)
	}
	if n := s.Requests("small"); n != 0 {
		t.Errorf("%d requests for small reached the server", n)
	}
	if !s.Listed("big") || !s.Listed("mid") {
		t.Error("a refused load unloaded another program's model")
	}
}

// A model the server lists is no load: the budget is not checked.
func TestBudgetSkipsResidentModel(t *testing.T) {
	s, c, _ := budgetSim(t, vramguard.Budget{MaxBytes: 1})
	if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "mid", Prompt: "x"}, vramguard.KeepAliveServerDefault, nil); err != nil {
		t.Fatalf("a generation on a resident model: %v", err)
	}
	if s.Loads("mid") != 1 {
		t.Errorf("mid loaded %d times", s.Loads("mid"))
	}
}

func TestBudgetNeedsReader(t *testing.T) {
	if _, err := vramguard.NewClient(vramguard.Options{Budget: &vramguard.Budget{Headroom: 1}}); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("NewClient with a budget and no VRAM reader: %v, want KindInvalidInput", err)
	}
}

// A chat is admitted like a generation: the same refusal, nothing sent.
func TestBudgetAdmitsChat(t *testing.T) {
	s, c, _ := budgetSim(t, vramguard.Budget{MaxBytes: 15 * gib})
	_, err := c.ChatStreaming(t.Context(), &vramguard.ChatRequest{Model: "small", Messages: []api.Message{{Role: "user", Content: "x"}}},
		vramguard.KeepAliveUnload, nil)
	var be *vramguard.RoomError
	if !errors.Is(err, vramguard.KindOutOfMemory) || !errors.As(err, &be) || be.Budget == nil {
		t.Fatalf("ChatStreaming = %v; want KindOutOfMemory wrapping a budget's *RoomError", err)
	}
	if e := new(vramguard.Error); !errors.As(err, &e) || e.Op != "chat" {
		t.Errorf("error %v: want Op chat", err)
	}
	if n := s.Requests("small"); n != 0 {
		t.Errorf("%d requests for small reached the server", n)
	}
}

// brokenGPU is a VRAM reader that always fails, like a GPU reader on a
// machine whose driver is gone.
type brokenGPU struct{ err error }

func (b brokenGPU) Snapshot(context.Context) (*vramguard.VRAMSnapshot, error) { return nil, b.err }

// A budget whose reader fails refuses the load with KindUnavailable and the
// reader's own error: never KindServer, since the server said nothing, and
// nothing is sent to the server.
func TestBudgetReaderFailureIsNotAServerError(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	cause := errors.New("no GPU driver on this machine")
	c, _ := countedClient(t, s, vramguard.Options{VRAM: brokenGPU{cause}, Budget: &vramguard.Budget{}})
	_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "small", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	if !errors.Is(err, vramguard.KindUnavailable) || errors.Is(err, vramguard.KindServer) || !errors.Is(err, cause) {
		t.Fatalf("got %v (kind %v), want KindUnavailable wrapping the reader's error", err, vramguard.KindOf(err))
	}
	if strings.Contains(err.Error(), "server error") {
		t.Errorf("message %q reads as the server's", err)
	}
	if s.Requests("small") != 0 {
		t.Errorf("%d generate requests reached the server", s.Requests("small"))
	}
}

// noDevices is a VRAM reader on a machine with a driver and no GPU.
type noDevices struct{}

func (noDevices) Snapshot(context.Context) (*vramguard.VRAMSnapshot, error) {
	return &vramguard.VRAMSnapshot{Source: "none here", Taken: time.Now()}, nil
}

// One Options value on a GPU box and on a machine without a GPU: with
// OffWithoutGPU the budget refuses the load where the device is measured,
// and switches itself off, with one INFO line, where it cannot be (no
// reader, or a reader that lists no device); without OffWithoutGPU both
// of those are refused as before.
func TestBudgetThatTravels(t *testing.T) {
	budget := vramguard.Budget{Headroom: 23 * gib, OffWithoutGPU: true} // more than the 24 GiB fake GPU can leave free with the model
	for _, tt := range []struct {
		name    string
		reader  func(*vramguardtest.Server) vramguard.VRAMReader
		wantOff bool
	}{
		{"GPU box", func(s *vramguardtest.Server) vramguard.VRAMReader { return s.GPU() }, false},
		{"no reader", func(*vramguardtest.Server) vramguard.VRAMReader { return nil }, true},
		{"reader without devices", func(*vramguardtest.Server) vramguard.VRAMReader { return noDevices{} }, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := threeModelSim(t, vramguardtest.Config{})
			var logs strings.Builder
			b := budget
			c, _ := countedClient(t, s, vramguard.Options{VRAM: tt.reader(s), Budget: &b,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			for range 2 {
				_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "small", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
				if tt.wantOff && err != nil {
					t.Fatalf("budget off: %v, want the load admitted", err)
				}
				if !tt.wantOff && !errors.Is(err, vramguard.ErrOverBudget) {
					t.Fatalf("budget on: %v, want ErrOverBudget", err)
				}
			}
			if c.BudgetOff() != tt.wantOff {
				t.Errorf("BudgetOff() = %v, want %v", c.BudgetOff(), tt.wantOff)
			}
			if n := strings.Count(logs.String(), "VRAM budget off"); n != map[bool]int{true: 1, false: 0}[tt.wantOff] {
				t.Errorf("%d 'VRAM budget off' lines:\n%s", n, logs.String())
			}
		})
	}
	t.Run("without OffWithoutGPU", func(t *testing.T) {
		s := threeModelSim(t, vramguardtest.Config{})
		if _, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), Budget: &vramguard.Budget{}}); !errors.Is(err, vramguard.KindInvalidInput) {
			t.Errorf("a budget without a reader: %v, want KindInvalidInput", err)
		}
		c, _ := countedClient(t, s, vramguard.Options{VRAM: noDevices{}, Budget: &vramguard.Budget{}})
		_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "small", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
		if !errors.Is(err, vramguard.KindInvalidInput) || c.BudgetOff() {
			t.Errorf("no device 0: %v (off %v), want KindInvalidInput and the budget on", err, c.BudgetOff())
		}
	})
}

// TestBudgetRoomBesidePendingLoad (the composition oracle's seed
// 1796172427729402862: a phase's two models loading at once under a budget
// that makes room): a load admitted first and still loading lands while
// the second makes room; the room's target counted the first load's
// memory, which the device then showed too, so the wait could not end and
// the second load was refused after its timeout. It now waits for the
// first to be listed, measures, and makes the room it needs.
func TestBudgetRoomBesidePendingLoad(t *testing.T) {
	s := newSim(t, vramguardtest.Config{TotalVRAM: 8 * gib},
		vramguardtest.ModelConfig{Name: "z", Size: 2 * gib},
		vramguardtest.ModelConfig{Name: "a", Size: 2 * gib, LoadLatency: 300 * time.Millisecond},
		vramguardtest.ModelConfig{Name: "c", Size: 4 * gib})
	loadForever(t, s, "z") // another program's idle model
	c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{MakeRoom: true},
		Timeouts: vramguard.Timeouts{FirstChunk: 3 * time.Second, Total: 3 * time.Second}})
	errs := make(chan error, 2)
	go func() {
		_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "a", Prompt: "x"}, vramguard.KeepAliveFor(time.Minute), nil)
		errs <- err
	}()
	if err := s.WaitFor(t.Context(), func() bool { return s.Requests("a") > 0 }); err != nil {
		t.Fatal(err)
	}
	_, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "c", Prompt: "x"}, vramguard.KeepAliveFor(time.Minute), nil)
	if err != nil {
		t.Errorf("c, admitted while a loads: %v; want room made and the load admitted", err)
	}
	if err := <-errs; err != nil {
		t.Errorf("a: %v", err)
	}
	// a (idle once its generation ended) and z are both 2 GiB: the
	// policy's fewest bytes may take either.
	if !s.Listed("c") || s.Listed("a") == s.Listed("z") {
		t.Errorf("resident %v; want c, and one of a and z unloaded to make room", s.Running())
	}
}

// TestBudgetRoomEndsWhenLoadedElsewhere (the composition oracle's seed
// 1796173904511439337): another program loads the model while this
// client's budget makes room for the same load. Its runner's memory, not
// listed yet, was waited for until the call's timeout, and the load was
// refused although the model was then loaded: a listed model is no load.
// The wait now ends when the server lists the model, and the call runs on
// it.
func TestBudgetRoomEndsWhenLoadedElsewhere(t *testing.T) {
	s := newSim(t, vramguardtest.Config{TotalVRAM: 8 * gib},
		vramguardtest.ModelConfig{Name: "c", Size: 4 * gib, LoadLatency: 300 * time.Millisecond})
	if err := s.Reserve("other", 2*gib); err != nil {
		t.Fatal(err)
	}
	c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{MakeRoom: true},
		Timeouts: vramguard.Timeouts{FirstChunk: 5 * time.Second, Total: 5 * time.Second}})
	other := loadingElsewhere(t, s, "c")
	gen, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "c", Prompt: "x"}, vramguard.KeepAliveFor(time.Minute), nil)
	if err != nil {
		t.Fatalf("c while another program loads it: %v; want the call to run on the model it loaded", err)
	}
	if gen.Loaded || s.Loads("c") != 1 {
		t.Errorf("Loaded %v, %d loads; want the other program's one load, reused", gen.Loaded, s.Loads("c"))
	}
	if err := <-other; err != nil {
		t.Fatal(err)
	}
}

// TestBudgetRoomBesideAnotherLoad (the composition oracle's seed
// 1796174817253588299, in the 10,000-schedule run): another program's
// model is loading when this client's budget must make room. Its runner's
// memory, not listed yet, was waited for as if it were leaving, for the
// whole wait, and the load was refused. The wait now also ends when that
// model is listed, and the room is planned with it: the other program's
// model, idle once loaded, is unloaded, verified, and the load admitted.
func TestBudgetRoomBesideAnotherLoad(t *testing.T) {
	s := newSim(t, vramguardtest.Config{TotalVRAM: 8 * gib},
		vramguardtest.ModelConfig{Name: "c", Size: 4 * gib, LoadLatency: 300 * time.Millisecond},
		vramguardtest.ModelConfig{Name: "b", Size: 3 * gib})
	if err := s.Reserve("other", 2*gib); err != nil {
		t.Fatal(err)
	}
	c := newTestClient(t, s, vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{MakeRoom: true},
		Timeouts: vramguard.Timeouts{FirstChunk: 3 * time.Second, Total: 3 * time.Second}})
	other := loadingElsewhere(t, s, "c")
	if _, err := c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "b", Prompt: "x"}, vramguard.KeepAliveFor(time.Minute), nil); err != nil {
		t.Fatalf("b while another program loads c: %v; want c unloaded once listed and b admitted", err)
	}
	if err := <-other; err != nil {
		t.Fatal(err)
	}
	if s.Listed("c") || !s.Listed("b") {
		t.Errorf("resident %v; want b, c unloaded to make room", s.Running())
	}
}

// loadingElsewhere starts another program's load of model on s (the raw
// API client, kept warm a minute) and returns once s shows it loading;
// the channel gets the request's outcome.
func loadingElsewhere(t *testing.T, s *vramguardtest.Server, model string) <-chan error {
	t.Helper()
	other := make(chan error, 1)
	go func() {
		other <- s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: model, Prompt: "x", KeepAlive: &api.Duration{Duration: time.Minute}},
			func(api.GenerateResponse) error { return nil })
	}()
	if err := s.WaitFor(t.Context(), func() bool { r := s.Running(); return len(r) == 1 && r[0].Loading }); err != nil {
		t.Fatal(err)
	}
	return other
}
