package vramguard_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

const gib = 1 << 30

// gpuSim starts a simulator with a 24 GiB GPU and three models loaded
// forever (8, 6 and 2 GiB), and a client whose VRAM reader reads it.
func gpuSim(t testing.TB, cfg vramguardtest.Config, opts vramguard.Options) (*vramguardtest.Server, *vramguard.OllamaClient) {
	s := threeModelSim(t, cfg)
	opts.Host = s.URL().String()
	opts.VRAM = &vramguardtest.GPU{Server: s}
	opts.PollInterval = 5 * time.Millisecond
	c, err := vramguard.NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	for _, m := range []string{"big", "mid", "small"} {
		if _, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: m, Prompt: "x"},
			vramguard.KeepAliveForever, nil); err != nil {
			t.Fatal(err)
		}
	}
	return s, c
}

// threeModelSim starts a simulator with a 24 GiB GPU and the three models
// of gpuSim, not loaded.
func threeModelSim(t testing.TB, cfg vramguardtest.Config) *vramguardtest.Server {
	cfg.Models = []vramguardtest.ModelConfig{
		{Name: "big", SizeVRAM: 8 * gib},
		{Name: "mid", SizeVRAM: 6 * gib},
		{Name: "small", SizeVRAM: 2 * gib},
	}
	s := vramguardtest.New(cfg)
	t.Cleanup(s.Close)
	return s
}

// loadForever loads models on s as another program would: through a
// client of its own, kept loaded forever.
func loadForever(t testing.TB, s *vramguardtest.Server, models ...string) {
	t.Helper()
	forever := &api.Duration{Duration: -1}
	for _, m := range models {
		if err := s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: m, Prompt: "x", KeepAlive: forever},
			func(api.GenerateResponse) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
}

func TestEnsureFree(t *testing.T) {
	const need = 11_200_000_000 // the text encoder of the original log
	tests := []struct {
		name      string
		need      uint64
		reserve   uint64 // held by another program
		all       bool
		evicted   []string
		resident  []string
		wantErr   vramguard.Kind
		errHolder string // named in the error
	}{
		{name: "already free", need: 6 * gib, evicted: nil, resident: []string{"big", "mid", "small"}},
		// 8 GiB free, 2.4 GiB missing: mid (6 GiB) is the fewest bytes
		// that make the room (it was big, the largest, before #34).
		{name: "fewest bytes that make the room", need: need, evicted: []string{"mid:latest"}, resident: []string{"big", "small"}},
		// 2 GiB free, 8.4 GiB missing: big and small (10 GiB), not big
		// and mid (14 GiB).
		{name: "two needed", need: need, reserve: 6 * gib, evicted: []string{"big:latest", "small:latest"}, resident: []string{"mid"}},
		{name: "all on request", need: need, all: true, evicted: []string{"big:latest", "mid:latest", "small:latest"}},
		// 1 GiB free and 16 GiB of models cannot reach 20 GiB: nothing is
		// unloaded, the refusal is at once and names comfyui (before #34
		// all three were unloaded and the wait timed out).
		{name: "someone else holds it", need: 20 * gib, reserve: 7 * gib, evicted: nil, resident: []string{"big", "mid", "small"},
			wantErr: vramguard.KindOutOfMemory, errHolder: "comfyui"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, c := gpuSim(t, vramguardtest.Config{}, vramguard.Options{})
			if tt.reserve > 0 {
				if err := s.Reserve("comfyui", tt.reserve); err != nil {
					t.Fatal(err)
				}
			}
			rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: tt.need, AllModels: tt.all, Timeout: 200 * time.Millisecond})
			if tt.wantErr != 0 {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("got %v, want %v", err, tt.wantErr)
				}
				var ie *vramguard.RoomError
				if !errors.As(err, &ie) || !strings.Contains(err.Error(), tt.errHolder) {
					t.Fatalf("error %v does not name %s", err, tt.errHolder)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range rep.Evicted {
				if !e.Verified {
					t.Errorf("eviction not verified: %+v", e)
				}
				got = append(got, e.Model)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.evicted) {
				t.Errorf("evicted %v, want %v", got, tt.evicted)
			}
			for _, m := range tt.resident {
				if !s.Listed(m) {
					t.Errorf("%s was evicted needlessly", m)
				}
			}
			if tt.wantErr == 0 {
				if rep.FreeAfter < tt.need || rep.Source != vramguardtest.GPUSource {
					t.Errorf("free after %d, source %s", rep.FreeAfter, rep.Source)
				}
				// The orchestrator's load now succeeds.
				if err := s.Reserve("text encoder", tt.need); err != nil {
					t.Fatalf("load after EnsureFree: %v", err)
				}
			}
		})
	}
}

func TestEnsureFreeWaitsForTheDriver(t *testing.T) {
	// The driver gives the memory back 150 ms after Ollama stops listing
	// the runner: EnsureFree must wait for the GPU, not trust /api/ps.
	s, c := gpuSim(t, vramguardtest.Config{ReleaseLag: 150 * time.Millisecond}, vramguard.Options{})
	if err := s.Reserve("comfyui", 6*gib); err != nil {
		t.Fatal(err)
	}
	rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 6 * gib})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Elapsed < 150*time.Millisecond || rep.FreeAfter < 6*gib || rep.FreeAfter-rep.FreeBefore < 6*gib {
		t.Fatalf("report %+v", rep)
	}
	if err := s.Reserve("unet", 6*gib); err != nil {
		t.Fatalf("load after EnsureFree: %v", err)
	}
}

func TestEnsureFreeInvalid(t *testing.T) {
	_, c := gpuSim(t, vramguardtest.Config{}, vramguard.Options{})
	for name, req := range map[string]vramguard.EnsureRequest{
		"absurd":           {Bytes: 1 << 62},
		"more than total":  {Bytes: 25 * gib},
		"negative device":  {Device: -1, Bytes: 1},
		"negative timeout": {Bytes: 1, Timeout: -1},
	} {
		if _, err := c.EnsureFree(t.Context(), req); !errors.Is(err, vramguard.KindInvalidInput) {
			t.Errorf("%s: got %v", name, err)
		}
	}
	if _, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Device: 3, Bytes: 1}); !errors.Is(err, vramguard.KindNotFound) {
		t.Errorf("missing device: got %v", err)
	}
}

// TestEnsureFreeWithoutReader: a client without a VRAM reader cannot tell
// how few models would make the room, so EnsureFree refuses, sending
// nothing and unloading nothing, unless AllModels asks for every model.
func TestEnsureFreeWithoutReader(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	loadForever(t, s, "big", "mid", "small") // another program's models
	c, ct := countedClient(t, s, vramguard.Options{})

	sent := ct.n.Load()
	rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: gib})
	if !errors.Is(err, vramguard.KindInvalidInput) || !errors.Is(err, vramguard.ErrNoVRAMReader) {
		t.Fatalf("EnsureFree = %+v, %v; want KindInvalidInput wrapping ErrNoVRAMReader", rep, err)
	}
	if n := ct.n.Load() - sent; n != 0 {
		t.Errorf("%d requests sent", n)
	}
	for _, m := range []string{"big", "mid", "small"} {
		if !s.Listed(m) {
			t.Errorf("%s was unloaded", m)
		}
	}

	rep, err = c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: gib, AllModels: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Evicted) != 3 || rep.Source != vramguard.SourceNone || rep.Snapshot != nil || rep.Release == nil {
		t.Errorf("AllModels without a reader: %+v", rep)
	}
	for _, m := range []string{"big", "mid", "small"} {
		if s.Listed(m) {
			t.Errorf("%s still listed after AllModels", m)
		}
	}
}

// TestPhaseHandoverWithoutReader: a phase that needs free VRAM on a client
// without a reader unloads its own models at End, then fails the hand-over
// with ErrNoVRAMReader and leaves other programs' models alone.
func TestPhaseHandoverWithoutReader(t *testing.T) {
	s := threeModelSim(t, vramguardtest.Config{})
	loadForever(t, s, "big", "mid")
	c, ct := countedClient(t, s, vramguard.Options{})
	// A hand-over that cannot be measured is refused up front, before the
	// phase loads anything.
	if _, err := c.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{NeedBytes: gib}); !errors.Is(err, vramguard.KindInvalidInput) || !errors.Is(err, vramguard.ErrNoVRAMReader) {
		t.Fatalf("StartPhase = %v; want ErrNoVRAMReader", err)
	}
	if n := ct.n.Load(); n != 0 {
		t.Errorf("%d requests sent", n)
	}
	if !s.Listed("big") || !s.Listed("mid") {
		t.Errorf("listed: big %v, mid %v; want both left alone", s.Listed("big"), s.Listed("mid"))
	}
}

// stampedReader records when each snapshot began.
type stampedReader struct {
	r  vramguard.VRAMReader
	mu sync.Mutex
	at []time.Time
}

func (r *stampedReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	r.mu.Lock()
	r.at = append(r.at, time.Now())
	r.mu.Unlock()
	return r.r.Snapshot(ctx)
}

// lastGap returns the time between the last two snapshots.
func (r *stampedReader) lastGap() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.at) < 2 {
		return 0
	}
	return r.at[len(r.at)-1].Sub(r.at[len(r.at)-2])
}

// TestEnsureFreeVRAMPollInterval: EnsureFree's wait for the driver polls
// the GPU every Options.VRAMPollInterval (defaultVRAMPollInterval when
// zero), not every PollInterval (5 ms here), unless the request sets its
// own PollInterval.
func TestEnsureFreeVRAMPollInterval(t *testing.T) {
	tests := []struct {
		name        string
		client      time.Duration // Options.VRAMPollInterval
		request     time.Duration // EnsureRequest.PollInterval
		wantAtLeast time.Duration
	}{
		{name: "default", wantAtLeast: vramguard.DefaultOptions().VRAMPollInterval},
		{name: "client's", client: 60 * time.Millisecond, wantAtLeast: 60 * time.Millisecond},
		{name: "request's", client: time.Hour, request: 40 * time.Millisecond, wantAtLeast: 40 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The driver gives the memory back 300 ms after the runner
			// left /api/ps, so the wait takes at least two snapshots.
			s := threeModelSim(t, vramguardtest.Config{ReleaseLag: 300 * time.Millisecond})
			loadForever(t, s, "big", "mid", "small")
			r := &stampedReader{r: &vramguardtest.GPU{Server: s}}
			c, _ := countedClient(t, s, vramguard.Options{VRAM: r, VRAMPollInterval: tt.client})
			if err := s.Reserve("comfyui", 6*gib); err != nil {
				t.Fatal(err)
			}
			_, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 6 * gib, PollInterval: tt.request, Timeout: 10 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if gap := r.lastGap(); gap < tt.wantAtLeast || gap >= time.Hour {
				t.Errorf("snapshots %v apart during the wait, want at least %v", gap, tt.wantAtLeast)
			}
		})
	}
	if _, err := vramguard.NewClient(vramguard.Options{VRAMPollInterval: -time.Millisecond}); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("negative VRAMPollInterval: %v", err)
	}
}

func TestUnloadVerifyVRAM(t *testing.T) {
	s, c := gpuSim(t, vramguardtest.Config{ReleaseLag: 100 * time.Millisecond}, vramguard.Options{VerifyVRAM: true})
	rep, err := c.UnloadModel(t.Context(), "big")
	if err != nil {
		t.Fatal(err)
	}
	_, _, free := s.Memory()
	if rep.VRAMFreed < 6*gib || free < 8*gib || rep.Elapsed < 100*time.Millisecond {
		t.Fatalf("report %+v, free %d", rep, free)
	}
}

func ExampleOllamaClient_EnsureFree() {
	// A simulated 24 GiB GPU with three Ollama models resident (16 GiB)
	// and 4 GiB held by the orchestrator itself.
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "big", SizeVRAM: 8 * gib}, {Name: "mid", SizeVRAM: 6 * gib}, {Name: "small", SizeVRAM: 2 * gib},
	}})
	defer s.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), VRAM: &vramguardtest.GPU{Server: s}})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	for _, m := range []string{"big", "mid", "small"} {
		if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: m, Prompt: "x"}, vramguard.KeepAliveForever, nil); err != nil {
			log.Fatal(err)
		}
	}
	_ = s.Reserve("orchestrator", 4*gib)

	// Right before loading an 11.2 GB text encoder:
	rep, err := c.EnsureFree(ctx, vramguard.EnsureRequest{Bytes: 11_200_000_000})
	if err != nil {
		log.Fatal(err) // names who holds the memory
	}
	for _, e := range rep.Evicted {
		fmt.Println("evicted", e.Model, e.Verified)
	}
	fmt.Printf("free %.1f GiB, from %s\n", float64(rep.FreeAfter)/gib, rep.Source)
	fmt.Println(s.Reserve("text encoder", 11_200_000_000))
	// Output:
	// evicted big:latest true
	// free 12.0 GiB, from simulated
	// <nil>
}

// UnloadModel's VerifyVRAM wait takes its snapshots at VRAMPollInterval,
// not at the /api/ps PollInterval.
func TestVerifyVRAMPollInterval(t *testing.T) {
	const cadence = 60 * time.Millisecond
	// The driver gives the memory back 300 ms after the runner left
	// /api/ps, so the wait takes several snapshots.
	s := threeModelSim(t, vramguardtest.Config{ReleaseLag: 300 * time.Millisecond})
	loadForever(t, s, "big")
	r := &stampedReader{r: &vramguardtest.GPU{Server: s}}
	c, _ := countedClient(t, s, vramguard.Options{VRAM: r, VerifyVRAM: true, VRAMPollInterval: cadence})
	rep, err := c.UnloadModel(t.Context(), "big")
	if err != nil || rep.Checked&vramguard.CheckDeviceMemory == 0 {
		t.Fatalf("UnloadModel: %+v, %v", rep, err)
	}
	if gap := r.lastGap(); gap < cadence {
		t.Errorf("snapshots %v apart during the VerifyVRAM wait, want at least %v (PollInterval is 5 ms)", gap, cadence)
	}
}

// AllModels' plan is in the victim policy's order, whatever the listing's:
// idle models the fewest bytes first, this client's own leased model
// after them (the order a slot-making caller takes the first of).
func TestAllModelsPlanFollowsTheVictimPolicy(t *testing.T) {
	for _, order := range [][]string{{"big", "mid", "small"}, {"small", "big", "mid"}, {"mid", "small", "big"}} {
		t.Run(strings.Join(order, ","), func(t *testing.T) {
			s := threeModelSim(t, vramguardtest.Config{})
			loadForever(t, s, order...)
			c := leaseClient(t, s, leaseDir(t), vramguard.Options{})
			rep, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{AllModels: true, DryRun: true})
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{"small:latest", "mid:latest", "big:latest"}; !slices.Equal(rep.Plan, want) {
				t.Fatalf("plan %q; want %q (fewest bytes first)", rep.Plan, want)
			}
			l, err := c.HoldModel(t.Context(), "small", time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Release()
			if rep, err = c.EnsureFree(t.Context(), vramguard.EnsureRequest{AllModels: true, DryRun: true}); err != nil {
				t.Fatal(err)
			}
			if want := []string{"mid:latest", "big:latest", "small:latest"}; !slices.Equal(rep.Plan, want) {
				t.Fatalf("plan with small leased by this client %q; want %q (own leased models last)", rep.Plan, want)
			}
		})
	}
}
