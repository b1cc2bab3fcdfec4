package vramprom_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/pool"
	"github.com/vramguard/vramguard/vramguardtest"
	"github.com/vramguard/vramguard/vramprom"
)

const gib = 1 << 30

// newSim starts a fake Ollama with tiny (2 GiB) and small (3 GiB), whose
// loads take long enough to count as loads (Options.LoadThreshold).
func newSim(t *testing.T, cfg vramguardtest.Config) *vramguardtest.Server {
	t.Helper()
	cfg.Models = append(cfg.Models,
		vramguardtest.ModelConfig{Name: "tiny", Size: 2 * gib, Chunks: 3, LoadLatency: 20 * time.Millisecond},
		vramguardtest.ModelConfig{Name: "small", Size: 3 * gib, Chunks: 3, LoadLatency: 20 * time.Millisecond},
	)
	s := vramguardtest.New(cfg)
	t.Cleanup(s.Close)
	return s
}

// setup returns a collector for cfg registered on a pedantic registry,
// and a client of s whose hooks feed it.
func setup(t *testing.T, s *vramguardtest.Server, cfg vramprom.Config, opts vramguard.Options) (*vramprom.Collector, *prometheus.Registry, *vramguard.OllamaClient) {
	t.Helper()
	col, err := vramprom.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(col); err != nil {
		t.Fatalf("pedantic registry refused the collector: %v", err)
	}
	opts.Host = s.URL().String()
	opts.Hooks = vramguard.JoinHooks(opts.Hooks, col.Hooks())
	opts.PollInterval = 5 * time.Millisecond
	opts.UnloadTimeout = 5 * time.Second
	if opts.Leases.Dir == "" {
		opts.Leases.Dir = filepath.Join(t.TempDir(), "leases")
	}
	c, err := vramguard.NewClient(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return col, reg, c
}

// series gathers reg and returns each series as name{label="value",...}
// (labels sorted, empty ones included) with its value: a counter's or a
// gauge's value, a histogram's sample count.
func series(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(ls)
			key := mf.GetName() + "{" + strings.Join(ls, ",") + "}"
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out[key] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[key] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// want checks that each series in w has its value.
func want(t *testing.T, got map[string]float64, w map[string]float64) {
	t.Helper()
	for k, v := range w {
		k = sortLabels(k)
		g, ok := got[k]
		if !ok {
			t.Errorf("no series %s; have:\n%s", k, dump(got, strings.SplitN(k, "{", 2)[0]))
			continue
		}
		if g != v {
			t.Errorf("%s = %v, want %v", k, g, v)
		}
	}
}

// sortLabels sorts the labels of a series key written by hand.
func sortLabels(k string) string {
	name, ls, ok := strings.Cut(strings.TrimSuffix(k, "}"), "{")
	if !ok || ls == "" {
		return k
	}
	parts := strings.Split(strings.TrimSuffix(ls, `"`), `",`)
	for i := range parts {
		parts[i] += `"`
	}
	sort.Strings(parts)
	return name + "{" + strings.Join(parts, ",") + "}"
}

// dump lists the series of one metric, for failure messages.
func dump(got map[string]float64, name string) string {
	var ls []string
	for k, v := range got {
		if strings.HasPrefix(k, name+"{") {
			ls = append(ls, fmt.Sprintf("  %s %v", k, v))
		}
	}
	slices.Sort(ls)
	return strings.Join(ls, "\n")
}

// hostPort is the server label of s.
func hostPort(s *vramguardtest.Server) string { return s.URL().Host }

func generate(t *testing.T, c *vramguard.OllamaClient, model string, ka vramguard.KeepAlive) (*vramguard.Generation, error) {
	t.Helper()
	return c.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: model, Prompt: "a castle at dawn"}, ka, nil)
}

// A phase on two models: two first loads, two calls with their tokens and
// first chunks, and the phase's end unloading both, verified.
func TestPhase(t *testing.T) {
	s := newSim(t, vramguardtest.Config{})
	_, reg, c := setup(t, s, vramprom.Config{}, vramguard.Options{})
	p, err := c.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g := p.Guard()
	for _, m := range []string{"tiny", "small"} {
		if _, err := g.Generate(t.Context(), &vramguard.GenerateRequest{Model: m, Prompt: "a castle at dawn"}, nil); err != nil {
			t.Fatalf("generate %s: %v", m, err)
		}
	}
	if _, err := p.End(t.Context()); err != nil {
		t.Fatalf("End: %v", err)
	}
	got := series(t, reg)
	srv := hostPort(s)
	w := map[string]float64{}
	for _, m := range []string{"tiny:latest", "small:latest"} {
		l := fmt.Sprintf(`model=%q,server=%q`, m, srv)
		w[`vramguard_model_loads_total{`+l+`,reload_cause="none"}`] = 1
		w[`vramguard_model_load_duration_seconds{`+l+`}`] = 1
		w[`vramguard_model_unloads_total{cause="phase end",`+l+`,outcome="verified"}`] = 1
		w[`vramguard_model_unload_duration_seconds{`+l+`,outcome="verified"}`] = 1
		w[`gen_ai_client_operation_duration_seconds{error_type="",`+fmt.Sprintf(`model=%q`, m)+`,operation="text_completion",provider="ollama",server=`+fmt.Sprintf("%q", srv)+`}`] = 1
		w[`gen_ai_client_operation_time_to_first_chunk_seconds{`+fmt.Sprintf(`model=%q`, m)+`,operation="text_completion",provider="ollama",server=`+fmt.Sprintf("%q", srv)+`}`] = 1
		w[`gen_ai_client_token_usage{`+fmt.Sprintf(`model=%q`, m)+`,operation="text_completion",token_type="input"}`] = 1
		w[`gen_ai_client_token_usage{`+fmt.Sprintf(`model=%q`, m)+`,operation="text_completion",token_type="output"}`] = 1
	}
	want(t, got, w)
	if n := testutil.CollectAndCount(reg, "vramguard_model_loads_total"); n != 2 {
		t.Errorf("%d load series, want 2:\n%s", n, dump(got, "vramguard_model_loads_total"))
	}
	if n := testutil.CollectAndCount(reg, "vramguard_model_reloads_total", "vramguard_budget_admissions_total"); n != 0 {
		t.Errorf("%d reload or admission series, want none", n)
	}

	// The token histogram holds the server's counts: 3 chunks out, and the
	// simulator's prompt_eval_count (one per word) in.
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "gen_ai_client_token_usage" {
			continue
		}
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			tt := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "token_type" {
					tt = l.GetValue()
				}
			}
			wantSum := map[string]float64{"input": 4, "output": 3}[tt]
			if h.GetSampleSum() != wantSum {
				t.Errorf("token_type %s: sum %v, want %v", tt, h.GetSampleSum(), wantSum)
			}
		}
	}
}

// A runner that crashes mid-stream: the call's duration carries the
// failure's kind, and no tokens or load are counted for it.
func TestCrash(t *testing.T) {
	s := newSim(t, vramguardtest.Config{})
	_, reg, c := setup(t, s, vramprom.Config{}, vramguard.Options{})
	if err := s.FailNext("tiny", vramguardtest.CrashAfter(1)); err != nil {
		t.Fatal(err)
	}
	_, err := generate(t, c, "tiny", vramguard.KeepAliveFor(time.Hour))
	if !errors.Is(err, vramguard.KindModelCrash) {
		t.Fatalf("generate: %v, want KindModelCrash", err)
	}
	got := series(t, reg)
	want(t, got, map[string]float64{
		fmt.Sprintf(`gen_ai_client_operation_duration_seconds{error_type="model crash",model="tiny:latest",operation="text_completion",provider="ollama",server=%q}`, hostPort(s)): 1,
	})
	if n := testutil.CollectAndCount(reg, "gen_ai_client_token_usage", "vramguard_model_loads_total", "gen_ai_client_operation_time_to_first_chunk_seconds"); n != 0 {
		t.Errorf("%d token, load or first-chunk series for a failed call, want none", n)
	}
}

// A budget that the model cannot fit refuses the load; one that fits
// admits it.
func TestAdmission(t *testing.T) {
	s := newSim(t, vramguardtest.Config{TotalVRAM: 4 * gib})
	if err := s.AddModel(vramguardtest.ModelConfig{Name: "huge", Size: 16 * gib}); err != nil {
		t.Fatal(err)
	}
	_, reg, c := setup(t, s, vramprom.Config{VRAM: s.GPU()}, vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{}})
	if _, err := generate(t, c, "huge", vramguard.KeepAliveUnload); !errors.Is(err, vramguard.ErrOverBudget) {
		t.Fatalf("generate huge: %v, want ErrOverBudget", err)
	}
	if _, err := generate(t, c, "tiny", vramguard.KeepAliveUnload); err != nil {
		t.Fatalf("generate tiny: %v", err)
	}
	got := series(t, reg)
	want(t, got, map[string]float64{
		fmt.Sprintf(`vramguard_budget_admissions_total{model="huge:latest",outcome="refused",server=%q}`, hostPort(s)):                                                               1,
		fmt.Sprintf(`vramguard_budget_admissions_total{model="tiny:latest",outcome="admitted",server=%q}`, hostPort(s)):                                                              1,
		fmt.Sprintf(`gen_ai_client_operation_duration_seconds{error_type="out of memory",model="huge:latest",operation="text_completion",provider="ollama",server=%q}`, hostPort(s)): 1,
	})
}

// Another program unloads a model whose keep-alive still runs: the next
// load is counted with the reason, as a load and as a reload.
func TestReloadAfterForeignUnload(t *testing.T) {
	s := newSim(t, vramguardtest.Config{})
	_, reg, c := setup(t, s, vramprom.Config{}, vramguard.Options{})
	if _, err := generate(t, c, "tiny", vramguard.KeepAliveFor(time.Hour)); err != nil {
		t.Fatal(err)
	}
	// Another program's unload (what `ollama stop tiny` sends).
	zero := &api.Duration{}
	if err := s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: "tiny", KeepAlive: zero}, func(api.GenerateResponse) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitFor(t.Context(), func() bool { return !s.Listed("tiny") }); err != nil {
		t.Fatal(err)
	}
	gen, err := generate(t, c, "tiny", vramguard.KeepAliveFor(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if gen.Reload == nil || gen.Reload.Cause != vramguard.ReloadForeign {
		t.Fatalf("Generation.Reload = %+v, want %q", gen.Reload, vramguard.ReloadForeign)
	}
	srv := hostPort(s)
	want(t, series(t, reg), map[string]float64{
		fmt.Sprintf(`vramguard_model_loads_total{model="tiny:latest",reload_cause="none",server=%q}`, srv):                                   1,
		fmt.Sprintf(`vramguard_model_loads_total{model="tiny:latest",reload_cause="unloaded or evicted by another program",server=%q}`, srv): 1,
		fmt.Sprintf(`vramguard_model_reloads_total{cause="unloaded or evicted by another program",model="tiny:latest",server=%q}`, srv):      1,
	})
}

// An unload a lease keeps is counted as leased, with no duration.
func TestUnloadLeased(t *testing.T) {
	s := newSim(t, vramguardtest.Config{})
	dir := filepath.Join(t.TempDir(), "leases")
	_, reg, c := setup(t, s, vramprom.Config{}, vramguard.Options{Leases: vramguard.LeaseOptions{Dir: dir}})
	_, _, holder := setup(t, s, vramprom.Config{}, vramguard.Options{Leases: vramguard.LeaseOptions{Dir: dir}})
	if _, err := generate(t, c, "tiny", vramguard.KeepAliveFor(time.Hour)); err != nil {
		t.Fatal(err)
	}
	lease, err := holder.HoldModel(t.Context(), "tiny", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.UnloadModel(t.Context(), "tiny"); !errors.Is(err, vramguard.ErrLeased) {
		t.Fatalf("UnloadModel of a leased model: %v, want ErrLeased", err)
	}
	if err := lease.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UnloadModel(t.Context(), "tiny"); err != nil {
		t.Fatal(err)
	}
	srv := hostPort(s)
	got := series(t, reg)
	want(t, got, map[string]float64{
		fmt.Sprintf(`vramguard_model_unloads_total{cause="unload",model="tiny:latest",outcome="leased",server=%q}`, srv):   1,
		fmt.Sprintf(`vramguard_model_unloads_total{cause="unload",model="tiny:latest",outcome="verified",server=%q}`, srv): 1,
	})
	if _, ok := got[fmt.Sprintf(`vramguard_model_unload_duration_seconds{model="tiny:latest",outcome="leased",server=%q}`, srv)]; ok {
		t.Error("a leased unload, which sends nothing, has a duration")
	}
}

// A wait for free memory that cannot succeed is observed with its kind.
func TestVRAMWait(t *testing.T) {
	// Another program's tiny (2 GiB) is unloaded to make the room, but the
	// driver keeps its memory for an hour: the wait for it ends at its
	// timeout. (A device another program fills is refused at once, with
	// no wait, since #34: nothing there could make the room.)
	s := newSim(t, vramguardtest.Config{TotalVRAM: 4 * gib, ReleaseLag: time.Hour})
	if err := s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: "tiny", Prompt: "x", KeepAlive: &api.Duration{Duration: -1}},
		func(api.GenerateResponse) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if err := s.Reserve("comfyui", gib); err != nil {
		t.Fatal(err)
	}
	_, reg, c := setup(t, s, vramprom.Config{}, vramguard.Options{VRAM: s.GPU()})
	_, err := c.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 2 * gib, Timeout: 50 * time.Millisecond, PollInterval: 10 * time.Millisecond})
	if !errors.Is(err, vramguard.KindOutOfMemory) || s.Listed("tiny") {
		t.Fatalf("EnsureFree = %v, tiny listed %v; want tiny unloaded and the wait for its memory ended", err, s.Listed("tiny"))
	}
	want(t, series(t, reg), map[string]float64{
		fmt.Sprintf(`vramguard_vram_wait_duration_seconds{device="0",error_type=%q,server=%q}`, vramguard.KindOf(err), hostPort(s)): 1,
	})
}

// The scrape-time gauges: the watched server's resident models with their
// size_vram, and the device's memory by holder, adding up to its total.
func TestGauges(t *testing.T) {
	s := newSim(t, vramguardtest.Config{TotalVRAM: 16 * gib})
	if err := s.Reserve("comfyui", 6*gib); err != nil {
		t.Fatal(err)
	}
	col, reg, c := setup(t, s, vramprom.Config{VRAM: s.GPU()}, vramguard.Options{})
	stop := col.Watch(c)
	defer stop()
	srv := hostPort(s)

	got := series(t, reg)
	want(t, got, map[string]float64{fmt.Sprintf(`vramguard_ollama_up{server=%q}`, srv): 1, `vramguard_device_reader_up{}`: 1})
	if n := testutil.CollectAndCount(reg, "vramguard_model_resident"); n != 0 {
		t.Errorf("%d resident series before any load", n)
	}

	if _, err := generate(t, c, "tiny", vramguard.KeepAliveFor(time.Hour)); err != nil {
		t.Fatal(err)
	}
	got = series(t, reg)
	want(t, got, map[string]float64{
		fmt.Sprintf(`vramguard_model_resident{model="tiny:latest",server=%q}`, srv):    1,
		fmt.Sprintf(`vramguard_model_vram_bytes{model="tiny:latest",server=%q}`, srv):  2 * gib,
		`vramguard_device_memory_bytes{device="0",holder="tiny:latest",kind="runner"}`: 2 * gib,
		`vramguard_device_memory_bytes{device="0",holder="comfyui",kind="other"}`:      6 * gib,
		`vramguard_device_memory_bytes{device="0",holder="",kind="free"}`:              8 * gib,
	})
	var sum float64
	for k, v := range got {
		if strings.HasPrefix(k, `vramguard_device_memory_bytes{device="0",`) {
			sum += v
		}
	}
	if sum != 16*gib {
		t.Errorf("device 0's holders add up to %v, want its 16 GiB:\n%s", sum, dump(got, "vramguard_device_memory_bytes"))
	}

	// Unloaded: the gauge goes; stopped: the server's series go.
	if _, err := c.UnloadModel(t.Context(), "tiny"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "vramguard_model_resident", "vramguard_model_vram_bytes"); n != 0 {
		t.Errorf("%d resident series after a verified unload", n)
	}
	stop()
	stop()
	if n := testutil.CollectAndCount(reg, "vramguard_ollama_up"); n != 0 {
		t.Errorf("%d up series after stop", n)
	}
}

// A server that does not answer and a reader that fails are 0 in their
// _up gauges, with no other series; the scrape itself succeeds.
func TestGaugesDown(t *testing.T) {
	s := newSim(t, vramguardtest.Config{})
	col, reg, c := setup(t, s, vramprom.Config{VRAM: failingReader{}}, vramguard.Options{KeepModelsOnClose: true})
	stop := col.Watch(c)
	defer stop()
	if _, err := generate(t, c, "tiny", vramguard.KeepAliveFor(time.Hour)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	got := series(t, reg)
	want(t, got, map[string]float64{fmt.Sprintf(`vramguard_ollama_up{server=%q}`, hostPort(s)): 0, `vramguard_device_reader_up{}`: 0})
	if n := testutil.CollectAndCount(reg, "vramguard_model_resident", "vramguard_device_memory_bytes"); n != 0 {
		t.Errorf("%d resident or device series from failed reads", n)
	}
}

type failingReader struct{}

func (failingReader) Snapshot(context.Context) (*vramguard.VRAMSnapshot, error) {
	return nil, errors.New("nvml: driver not loaded")
}

// twoDevices reports devices 0 and 1, each with two processes of one
// command (summed into one series) and memory no process accounts for.
type twoDevices struct{}

func (twoDevices) Snapshot(context.Context) (*vramguard.VRAMSnapshot, error) {
	var ds []vramguard.DeviceMemory
	for i := range 2 {
		ds = append(ds, vramguard.DeviceMemory{Index: i, Total: 8 * gib, Used: 5 * gib, Free: 3 * gib, ProcessesKnown: true,
			Processes: []vramguard.GPUProcess{
				{PID: 10, UsedBytes: 1 * gib, UsedKnown: true, Command: "python main.py"},
				{PID: 11, UsedBytes: 2 * gib, UsedKnown: true, Command: "python main.py"},
				{PID: 12, UsedBytes: 1 * gib, UsedKnown: true, Role: vramguard.RoleOllamaRunner, Model: "tiny:latest"},
			}})
	}
	return &vramguard.VRAMSnapshot{Source: "fake", Taken: time.Now(), Devices: ds}, nil
}

func TestDevices(t *testing.T) {
	col, err := vramprom.New(vramprom.Config{VRAM: twoDevices{}, Devices: []int{1}})
	if err != nil {
		t.Fatal(err)
	}
	const exp = `
# HELP vramguard_device_memory_bytes Device memory by holder, as the driver reports it: kind runner (holder: model), other (holder: command), unattributed, free; a device's series add up to its total.
# TYPE vramguard_device_memory_bytes gauge
vramguard_device_memory_bytes{device="1",holder="",kind="free"} 3.221225472e+09
vramguard_device_memory_bytes{device="1",holder="",kind="unattributed"} 1.073741824e+09
vramguard_device_memory_bytes{device="1",holder="python main.py",kind="other"} 3.221225472e+09
vramguard_device_memory_bytes{device="1",holder="tiny:latest",kind="runner"} 1.073741824e+09
`
	if err := testutil.CollectAndCompare(col, strings.NewReader(exp), "vramguard_device_memory_bytes"); err != nil {
		t.Error(err)
	}
}

func TestNew(t *testing.T) {
	tests := []struct {
		name string
		cfg  vramprom.Config
		ok   bool
	}{
		{name: "zero", ok: true},
		{name: "namespace", cfg: vramprom.Config{Namespace: "gpu_box"}, ok: true},
		{name: "namespace with a dash", cfg: vramprom.Config{Namespace: "gpu-box"}},
		{name: "namespace with a digit first", cfg: vramprom.Config{Namespace: "1box"}},
		{name: "reserved namespace", cfg: vramprom.Config{Namespace: "__x"}},
		{name: "negative device", cfg: vramprom.Config{Devices: []int{0, -1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			col, err := vramprom.New(tt.cfg)
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, vramguard.KindInvalidInput)) {
				t.Fatalf("New = %v; want ok %v (else KindInvalidInput)", err, tt.ok)
			}
			if err != nil {
				return
			}
			if err := prometheus.NewPedanticRegistry().Register(col); err != nil {
				t.Errorf("pedantic registry: %v", err)
			}
		})
	}
}

// The namespace renames the lifecycle metrics and leaves the gen_ai ones.
func TestNamespace(t *testing.T) {
	s := newSim(t, vramguardtest.Config{})
	_, reg, c := setup(t, s, vramprom.Config{Namespace: "box"}, vramguard.Options{})
	if _, err := generate(t, c, "tiny", vramguard.KeepAliveUnload); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "box_model_loads_total", "gen_ai_client_operation_duration_seconds"); n != 2 {
		t.Errorf("%d series of box_model_loads_total and gen_ai_client_operation_duration_seconds, want 2", n)
	}
	if n := testutil.CollectAndCount(reg, "vramguard_model_loads_total"); n != 0 {
		t.Errorf("%d vramguard_ series with namespace box", n)
	}
}

// Every metric passes client_golang's linter, and a pedantic registry
// gathers every kind of series (described, consistent, no duplicates).
func TestLint(t *testing.T) {
	s := newSim(t, vramguardtest.Config{TotalVRAM: 4 * gib})
	if err := s.AddModel(vramguardtest.ModelConfig{Name: "huge", Size: 16 * gib}); err != nil {
		t.Fatal(err)
	}
	col, reg, c := setup(t, s, vramprom.Config{VRAM: s.GPU()}, vramguard.Options{VRAM: s.GPU(), Budget: &vramguard.Budget{}})
	stop := col.Watch(c)
	defer stop()
	// The same server watched through a second client, whose Options.Host
	// names it in another form: read once (two series of one name and
	// labels would fail the pedantic gather).
	stop2 := col.Watch(plainClient(t, s, "http://"+hostPort(s)+"/", col.Hooks()))
	defer stop2()
	_, _ = generate(t, c, "huge", vramguard.KeepAliveUnload)
	if _, err := generate(t, c, "tiny", vramguard.KeepAliveFor(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.UnloadModel(t.Context(), "tiny"); err != nil {
		t.Fatal(err)
	}
	if _, err := generate(t, c, "tiny", vramguard.KeepAliveFor(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err != nil {
		t.Fatalf("pedantic gather: %v", err)
	}
	problems, err := testutil.CollectAndLint(col)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	if n := testutil.CollectAndCount(reg, "vramguard_ollama_up"); n != 1 {
		t.Errorf("%d up series for one server watched twice, want 1", n)
	}
}

// Server labels are the host:port of the client's Host, whatever form
// its Options.Host took; a client made with an api.Client and no host has
// an empty one.
func TestServerLabel(t *testing.T) {
	s := newSim(t, vramguardtest.Config{})
	col, err := vramprom.New(vramprom.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	tests := []struct {
		name, host, label string
		up                float64
	}{
		{name: "host:port", host: hostPort(s), label: hostPort(s), up: 1},
		{name: "URL", host: "http://" + hostPort(s), label: hostPort(s), up: 1},
		{name: "URL with a slash", host: "http://" + hostPort(s) + "/", label: hostPort(s), up: 1},
		{name: "no port", host: "127.0.0.1", label: "127.0.0.1:11434", up: -1}, // up: whether this machine serves 11434
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := plainClient(t, s, tt.host, col.Hooks())
			stop := col.Watch(c)
			defer stop()
			got := series(t, reg)
			k := fmt.Sprintf(`vramguard_ollama_up{server=%q}`, tt.label)
			if v, ok := got[k]; !ok || tt.up >= 0 && v != tt.up {
				t.Errorf("%s = %v (present %v), want %v; have:\n%s", k, v, ok, tt.up, dump(got, "vramguard_ollama_up"))
			}
			if n := testutil.CollectAndCount(reg, "vramguard_ollama_up"); n != 1 {
				t.Errorf("%d up series, want 1", n)
			}
		})
	}
	t.Run("api client", func(t *testing.T) {
		c, err := vramguard.NewClient(vramguard.Options{API: api.NewClient(s.URL(), http.DefaultClient), Leases: vramguard.LeaseOptions{Off: true}})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		stop := col.Watch(c)
		defer stop()
		want(t, series(t, reg), map[string]float64{`vramguard_ollama_up{server=""}`: 1})
	})
	_ = col.Watch(nil) // watches nothing
}

// plainClient is a client of host (a form of s's address), with hooks
// and no leases, closed at the end of the test.
func plainClient(t *testing.T, s *vramguardtest.Server, host string, h vramguard.Hooks) *vramguard.OllamaClient {
	t.Helper()
	c, err := vramguard.NewClient(vramguard.Options{Host: host, Hooks: h, Leases: vramguard.LeaseOptions{Off: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A pool of two members (16 and 24 GiB): a first call placed by room on
// the larger, the next warm there, each counted with its member, reason
// and model; both members up, and the pool's listing under its own
// server label.
func TestPool(t *testing.T) {
	var sims []*vramguardtest.Server
	var ms []pool.Member
	for i, total := range []uint64{16 * gib, 24 * gib} {
		s := newSim(t, vramguardtest.Config{TotalVRAM: total, StrictVRAM: true})
		sims = append(sims, s)
		ms = append(ms, pool.Member{Name: fmt.Sprintf("gpu%d", i), Host: s.URL().String(), VRAM: s.GPU()})
	}
	col, err := vramprom.New(vramprom.Config{})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(col)
	c, err := pool.New(pool.Options{Members: ms, ProbeInterval: 20 * time.Millisecond, OnPlace: col.Place},
		vramguard.Options{Hooks: col.Hooks(), PollInterval: 5 * time.Millisecond, Leases: vramguard.LeaseOptions{Dir: filepath.Join(t.TempDir(), "leases")}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	stop := col.WatchPool(c)
	defer stop()

	want(t, series(t, reg), map[string]float64{`vramguard_pool_member_up{member="gpu0"}`: 1, `vramguard_pool_member_up{member="gpu1"}`: 1})
	var reasons []pool.PlaceReason
	for range 2 {
		ctx, placed := pool.WithPlacements(t.Context())
		if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "tiny", Prompt: "x"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
			t.Fatal(err)
		}
		if len(placed()) != 1 {
			t.Fatalf("a pool's generation with placements %+v; want one", placed())
		}
		reasons = append(reasons, placed()[0].Reason)
	}
	if !slices.Equal(reasons, []pool.PlaceReason{pool.PlaceRoom, pool.PlaceWarm}) || !sims[1].Listed("tiny") || sims[0].Listed("tiny") {
		t.Fatalf("placements %q, tiny on gpu0 %v, gpu1 %v; want room then warm, on gpu1", reasons, sims[0].Listed("tiny"), sims[1].Listed("tiny"))
	}
	srv := serverLabelOf(t, c.OllamaClient)
	got := series(t, reg)
	want(t, got, map[string]float64{
		`vramguard_pool_placements_total{member="gpu1",model="tiny:latest",reason="room"}`:                 1,
		`vramguard_pool_placements_total{member="gpu1",model="tiny:latest",reason="warm"}`:                 1,
		`vramguard_pool_member_up{member="gpu0"}`:                                                          1,
		`vramguard_pool_member_up{member="gpu1"}`:                                                          1,
		fmt.Sprintf(`vramguard_ollama_up{server=%q}`, srv):                                                 1,
		fmt.Sprintf(`vramguard_model_resident{model="tiny:latest",server=%q}`, srv):                        1,
		fmt.Sprintf(`vramguard_model_loads_total{model="tiny:latest",reload_cause="none",server=%q}`, srv): 1,
	})
	if n := testutil.CollectAndCount(reg, "vramguard_pool_placements_total"); n != 2 {
		t.Errorf("%d placement series, want 2:\n%s", n, dump(got, "vramguard_pool_placements_total"))
	}
	problems, err := testutil.CollectAndLint(col, "vramguard_pool_placements_total", "vramguard_pool_member_up")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
	stop()
	if n := testutil.CollectAndCount(reg, "vramguard_pool_member_up"); n != 0 {
		t.Errorf("%d member series after stop", n)
	}
}

// serverLabelOf is the server label of c: its Host's host:port.
func serverLabelOf(t *testing.T, c *vramguard.OllamaClient) string {
	t.Helper()
	u, err := url.Parse(c.Host())
	if err != nil || u.Port() == "" {
		t.Fatalf("Host %q: %v", c.Host(), err)
	}
	return u.Host
}

// An unload of a model that is gone already (another unload, or the
// budget, evicted it) is no second eviction: its own outcome, "already
// gone" (issue #35: one load counted two verified unloads).
func TestUnloadAlreadyGone(t *testing.T) {
	s := newSim(t, vramguardtest.Config{})
	_, reg, c := setup(t, s, vramprom.Config{}, vramguard.Options{})
	if _, err := generate(t, c, "tiny", vramguard.KeepAliveFor(time.Hour)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if rep, err := c.UnloadModel(t.Context(), "tiny"); err != nil || !rep.Verified {
			t.Fatalf("UnloadModel = %+v, %v", rep, err)
		}
	}
	srv := hostPort(s)
	want(t, series(t, reg), map[string]float64{
		fmt.Sprintf(`vramguard_model_loads_total{model="tiny:latest",reload_cause="none",server=%q}`, srv):                     1,
		fmt.Sprintf(`vramguard_model_unloads_total{cause="unload",model="tiny:latest",outcome="verified",server=%q}`, srv):     1,
		fmt.Sprintf(`vramguard_model_unloads_total{cause="unload",model="tiny:latest",outcome="already gone",server=%q}`, srv): 1,
	})
}

// TestGaugesNameComfyUI: features in pairs. With the VRAM reader wrapped
// by comfyui.Client.Reader, the fake ComfyUI's process ("python main.py"
// on the fake GPU) is the holder "ComfyUI" in the device's series.
func TestGaugesNameComfyUI(t *testing.T) {
	s := newSim(t, vramguardtest.Config{TotalVRAM: 16 * gib})
	fake, err := comfyuitest.NewServer(s, comfyuitest.Config{ContextBytes: gib})
	if err != nil {
		t.Fatal(err)
	}
	defer fake.Close()
	cc, err := comfyui.New(comfyui.Options{URL: fake.URL().String(), PID: fake.PID()})
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	_, reg, _ := setup(t, s, vramprom.Config{VRAM: cc.Reader(s.GPU())}, vramguard.Options{})
	got := series(t, reg)
	want(t, got, map[string]float64{`vramguard_device_memory_bytes{device="0",holder="ComfyUI",kind="other"}`: gib})
	if _, ok := got[`vramguard_device_memory_bytes{device="0",holder="python main.py",kind="other"}`]; ok {
		t.Errorf("ComfyUI also listed by its command:\n%s", dump(got, "vramguard_device_memory_bytes"))
	}
}
