package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/gpu"
)

// watcher reads both sides of the GPU.
type watcher struct {
	gpu     vramguard.VRAMReader // nil when none could be opened (gpuErr says why)
	gpuErr  error
	ollama  *vramguard.OllamaClient
	host    string
	timeout time.Duration // bounds each side's read
	// procRoot is where the runners are read from when there is no GPU
	// snapshot: a procfs root, "" meaning /proc.
	procRoot string
	// comfy is ComfyUI's client (-comfyui); nil when not watched.
	comfy *comfyui.Client
}

// report is one look at the GPU and at Ollama; it is also the JSON output.
type report struct {
	Time time.Time `json:"time"`
	// GPU is nil when no reader could be opened or the snapshot failed;
	// GPUError then says why.
	GPU      *gpuReport `json:"gpu"`
	GPUError string     `json:"gpu_error,omitempty"`
	// Ollama is nil when the server did not answer; OllamaError says why.
	Ollama      *ollamaReport `json:"ollama"`
	OllamaError string        `json:"ollama_error,omitempty"`
	// NamesError says why runners could not be mapped to models (a failed
	// /api/show); the report is complete otherwise.
	NamesError string `json:"names_error,omitempty"`
	// Runners are the Ollama runner processes holding GPU memory, each
	// once however many devices it spans. Discovery processes are not
	// runners: they show among the processes with the role "ollama
	// discovery". Without a GPU snapshot they are the runners /proc lists,
	// their memory not known.
	Runners []runner `json:"runners"`
	// ComfyUI is how ComfyUI (-comfyui) runs, from its /system_stats:
	// its mode and the --reserve-vram and --vram-headroom it was started
	// with; nil when not watched or it did not answer (ComfyUIError).
	ComfyUI      *comfyReport `json:"comfyui,omitempty"`
	ComfyUIError string       `json:"comfyui_error,omitempty"`

	// noReader: no GPU reader could be opened, for the whole run;
	// GPUError says why.
	noReader bool
}

// comfyReport is ComfyUI's launch as /system_stats shows it.
type comfyReport struct {
	URL     string `json:"url"`
	Version string `json:"version"`
	Mode    string `json:"mode"` // "DynamicVRAM", "ModelPatcher" or "" (unknown)
	// ReserveVRAM and VRAMHeadroom are the flags' bytes; nil when argv
	// does not give them.
	ReserveVRAM  *uint64 `json:"reserve_vram,omitempty"`
	VRAMHeadroom *uint64 `json:"vram_headroom,omitempty"`
}

// comfyOf reads ComfyUI's launch from its /system_stats.
func comfyOf(ctx context.Context, c *comfyui.Client) (*comfyReport, error) {
	st, err := c.SystemStats(ctx)
	if err != nil {
		return nil, err
	}
	r := &comfyReport{URL: c.URL(), Version: st.System.ComfyUIVersion, Mode: string(st.Mode())}
	if n, ok := st.GBFlag("--reserve-vram"); ok {
		r.ReserveVRAM = &n
	}
	if n, ok := st.GBFlag("--vram-headroom"); ok {
		r.VRAMHeadroom = &n
	}
	return r, nil
}

type gpuReport struct {
	Source  string   `json:"source"`
	Devices []device `json:"devices"`
}

type device struct {
	Index          int       `json:"index"`
	Name           string    `json:"name"`
	UUID           string    `json:"uuid,omitempty"`
	Total          uint64    `json:"total"`
	Used           uint64    `json:"used"`
	Free           uint64    `json:"free"`
	ProcessesKnown bool      `json:"processes_known"`
	Processes      []process `json:"processes"`
}

type process struct {
	PID       uint32 `json:"pid"`
	UsedBytes uint64 `json:"used_bytes"`
	UsedKnown bool   `json:"used_known"`
	Role      string `json:"role"`
	Command   string `json:"command,omitempty"`
	// Blob is the weights blob a runner's command line names.
	Blob string `json:"blob,omitempty"`
}

type ollamaReport struct {
	Host   string  `json:"host"`
	Models []model `json:"models"`
}

type model struct {
	Name      string    `json:"name"`
	Size      int64     `json:"size"`
	SizeVRAM  int64     `json:"size_vram"`
	ExpiresAt time.Time `json:"expires_at"`
	// RunnerPID is the runner serving the model, when that is certain: the
	// runner named after it, or one model listed and one runner (on the
	// GPU, else in /proc). Zero otherwise.
	RunnerPID uint32 `json:"runner_pid,omitempty"`
}

type runner struct {
	PID       uint32 `json:"pid"`
	UsedBytes uint64 `json:"used_bytes"`
	UsedKnown bool   `json:"used_known"`
	// Model is the model it serves, when that is certain: named through
	// its weights blob (gpu.NameRunners), or the only model
	// listed next to the only runner.
	Model string `json:"model,omitempty"`
	// Orphan: no live Ollama server will free its memory
	// (gpu.FindOrphans): its server is gone (ServerGone), or Ollama
	// lists no model at all.
	Orphan     bool `json:"orphan"`
	ServerGone bool `json:"server_gone,omitempty"`
}

// collect reads the GPU and Ollama. A side that fails is reported in the
// report, not as an error.
func (w *watcher) collect(ctx context.Context) *report {
	rep := &report{Time: time.Now(), Runners: []runner{}}

	var snap *vramguard.VRAMSnapshot
	switch {
	case w.gpu == nil:
		rep.GPUError = "no GPU reader: " + gpuReason(w.gpuErr)
		rep.noReader = true
	default:
		sctx, cancel := context.WithTimeout(ctx, w.timeout)
		s, err := w.gpu.Snapshot(sctx)
		cancel()
		if err != nil {
			rep.GPUError = "GPU snapshot failed: " + trim(err)
		} else {
			snap = s
			rep.GPU = gpuOf(s)
		}
	}

	// The runners: the GPU's, else those /proc lists, in a snapshot of
	// their own for gpu.NameRunners and gpu.FindOrphans (rep.GPU stays nil).
	runners := snap
	if runners == nil {
		runners = procSnapshot(w.procRoot)
	}

	octx, cancel := context.WithTimeout(ctx, w.timeout)
	defer cancel()
	ps, err := w.ollama.Running(octx)
	if err != nil {
		rep.OllamaError = fmt.Sprintf("Ollama at %s does not answer: %s", w.host, trim(err))
	} else {
		rep.Ollama = &ollamaReport{Host: w.host, Models: modelsOf(ps)}
		// Runners name weights blobs; the server knows whose they are.
		if err := gpu.NameRunners(octx, w.ollama, runners); err != nil {
			rep.NamesError = "runners not named: " + trim(err)
		}
	}

	rep.Runners = runnersOf(runners)
	loaded := 1 // Ollama not answering: only runners whose server is gone are sure orphans
	if rep.Ollama != nil {
		loaded = len(rep.Ollama.Models)
		linkModels(rep.Ollama.Models, rep.Runners)
	}
	for _, o := range gpu.FindOrphans(runners, loaded) {
		if i := slices.IndexFunc(rep.Runners, func(r runner) bool { return r.PID == o.PID }); i >= 0 {
			rep.Runners[i].Orphan = true
		}
	}
	if w.comfy != nil {
		cr, err := comfyOf(octx, w.comfy)
		if err != nil {
			rep.ComfyUIError = fmt.Sprintf("ComfyUI at %s does not answer: %s", w.comfy.URL(), trim(err))
		} else {
			rep.ComfyUI = cr
		}
	}
	return rep
}

// procSnapshot holds the runners /proc lists, their memory not known, on
// one device that stands for the machine; nil when there are none or /proc
// cannot be read (a system without one).
func procSnapshot(root string) *vramguard.VRAMSnapshot {
	ps, err := procRunners(root)
	if err != nil || len(ps) == 0 {
		return nil
	}
	return &vramguard.VRAMSnapshot{Source: "procfs", Taken: time.Now(), Devices: []vramguard.DeviceMemory{{Processes: ps}}}
}

// linkModels sets each model's runner: the runner named after it; else,
// with one model and one unnamed runner, that runner (a snapshot that
// names no blob cannot tell more).
func linkModels(models []model, runners []runner) {
	for i := range models {
		want := vramguard.NormalizeModelName(models[i].Name)
		for _, r := range runners {
			if r.Model != "" && vramguard.NormalizeModelName(r.Model) == want {
				models[i].RunnerPID = r.PID
				break
			}
		}
	}
	if len(models) == 1 && len(runners) == 1 && models[0].RunnerPID == 0 && runners[0].Model == "" && !runners[0].ServerGone {
		models[0].RunnerPID = runners[0].PID
		runners[0].Model = models[0].Name
	}
}

// gpuReason is why no GPU reader could be opened: the cause inside
// vramguard's error, without its "no GPU reader: " (said by the caller).
func gpuReason(err error) string {
	if err == nil {
		return "none configured"
	}
	var e *vramguard.Error
	if errors.As(err, &e) && e.Err != nil {
		err = e.Err
	}
	return strings.TrimPrefix(trim(err), "no GPU reader: ")
}

// trim returns err's text on one line, without the repeated package prefix.
func trim(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "vramguard: ", "")), " ")
}

func gpuOf(s *vramguard.VRAMSnapshot) *gpuReport {
	g := &gpuReport{Source: s.Source, Devices: []device{}}
	for _, d := range s.Devices {
		dev := device{
			Index: d.Index, Name: d.Name, UUID: d.UUID,
			Total: d.Total, Used: d.Used, Free: d.Free,
			ProcessesKnown: d.ProcessesKnown, Processes: []process{},
		}
		for _, p := range d.Processes {
			dev.Processes = append(dev.Processes, process{
				PID: p.PID, UsedBytes: p.UsedBytes, UsedKnown: p.UsedKnown,
				Role: p.Role.String(), Command: p.Command, Blob: p.Blob,
			})
		}
		g.Devices = append(g.Devices, dev)
	}
	return g
}

func modelsOf(ps []api.ProcessModelResponse) []model {
	out := make([]model, 0, len(ps))
	for _, m := range ps {
		name := m.Name
		if name == "" {
			name = m.Model
		}
		out = append(out, model{Name: name, Size: m.Size, SizeVRAM: m.SizeVRAM, ExpiresAt: m.ExpiresAt})
	}
	// By name, so that rows keep their place from one refresh to the next.
	slices.SortStableFunc(out, func(a, b model) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// runnersOf lists the Ollama runners of snap, once each, memory summed over
// devices, largest first.
func runnersOf(snap *vramguard.VRAMSnapshot) []runner {
	out := []runner{}
	if snap == nil {
		return out
	}
	for _, d := range snap.Devices {
		for _, p := range d.Processes {
			if p.Role != vramguard.RoleOllamaRunner {
				continue
			}
			i := slices.IndexFunc(out, func(r runner) bool { return r.PID == p.PID })
			if i < 0 {
				out = append(out, runner{PID: p.PID, UsedBytes: p.UsedBytes, UsedKnown: p.UsedKnown, Model: p.Model, ServerGone: p.Orphaned})
				continue
			}
			out[i].UsedBytes += p.UsedBytes
			out[i].UsedKnown = out[i].UsedKnown && p.UsedKnown
			out[i].Model = cmp.Or(out[i].Model, p.Model)
			out[i].ServerGone = out[i].ServerGone || p.Orphaned
		}
	}
	slices.SortFunc(out, func(a, b runner) int {
		return cmp.Or(cmp.Compare(b.UsedBytes, a.UsedBytes), cmp.Compare(a.PID, b.PID))
	})
	return out
}

// writeTable writes rep as text: a section per device (without a GPU
// snapshot, why not, then the runners /proc lists), then Ollama's models,
// then any orphans. sayNoReader: write the line that says there is no GPU
// reader, which a live table on a pipe writes only in its first frame.
func writeTable(w io.Writer, rep *report, sayNoReader bool) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	byPID := make(map[uint32]runner, len(rep.Runners))
	for _, r := range rep.Runners {
		byPID[r.PID] = r
	}

	if rep.GPU == nil {
		said := false
		if sayNoReader || !rep.noReader {
			fmt.Fprintln(tw, rep.GPUError)
			said = true
		}
		if len(rep.Runners) > 0 {
			fmt.Fprintln(tw, "Ollama runners (from /proc; memory not known):")
			fmt.Fprintln(tw, "  PID\tSERVES")
			for _, r := range rep.Runners {
				fmt.Fprintf(tw, "  %d\t%s\n", r.PID, servesOf(r, rep.Ollama != nil))
			}
			said = true
		}
		if said {
			fmt.Fprintln(tw)
		}
	} else {
		for i, d := range rep.GPU.Devices {
			if i > 0 {
				fmt.Fprintln(tw)
			}
			fmt.Fprintf(tw, "GPU %d  %s  %s used of %s, %s free  (%s)\n",
				d.Index, d.Name, human(d.Used, true), human(d.Total, true), human(d.Free, true), rep.GPU.Source)
			switch {
			case !d.ProcessesKnown:
				fmt.Fprintln(tw, "  (the driver does not list processes)")
				continue
			case len(d.Processes) == 0:
				fmt.Fprintln(tw, "  (no process holds memory)")
				continue
			}
			fmt.Fprintln(tw, "  PID\tMEMORY\tROLE\tSERVES\tCOMMAND")
			for _, p := range d.Processes {
				serves := "-"
				if r, ok := byPID[p.PID]; ok {
					serves = servesOf(r, rep.Ollama != nil)
				}
				fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\n", p.PID, human(p.UsedBytes, p.UsedKnown), p.Role, serves, orDash(p.Command))
			}
		}
		if len(rep.GPU.Devices) == 0 {
			fmt.Fprintf(tw, "no GPU devices  (%s)\n", rep.GPU.Source)
		}
		fmt.Fprintln(tw)
	}

	if rep.Ollama == nil {
		fmt.Fprintln(tw, rep.OllamaError)
	} else {
		n := len(rep.Ollama.Models)
		fmt.Fprintf(tw, "Ollama at %s: %d %s loaded\n", rep.Ollama.Host, n, plural(n, "model", "models"))
		if n > 0 {
			fmt.Fprintln(tw, "  MODEL\tSIZE\tVRAM\tEXPIRES\tRUNNER")
			for _, m := range rep.Ollama.Models {
				pid := "?"
				switch {
				case m.RunnerPID != 0:
					pid = strconv.FormatUint(uint64(m.RunnerPID), 10)
				case len(rep.Runners) == 0 && rep.GPU != nil && !slices.ContainsFunc(rep.GPU.Devices, func(d device) bool { return !d.ProcessesKnown }):
					// No runner on a GPU that lists its processes: the
					// model runs on the CPU.
					pid = "-"
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", m.Name, human(uint64(max(m.Size, 0)), true),
					human(uint64(max(m.SizeVRAM, 0)), true), expiry(m.ExpiresAt, rep.Time), pid)
			}
		}
	}
	if rep.NamesError != "" {
		fmt.Fprintf(tw, "  (%s)\n", rep.NamesError)
	}
	var unknown []string
	for _, r := range rep.Runners {
		switch {
		case r.Model != "" || r.Orphan:
		case r.UsedKnown:
			unknown = append(unknown, fmt.Sprintf("%d (%s)", r.PID, human(r.UsedBytes, true)))
		default:
			unknown = append(unknown, strconv.FormatUint(uint64(r.PID), 10))
		}
	}
	if n := len(unknown); n > 0 {
		fmt.Fprintf(tw, "  %s %s: which serves which model is not known\n", plural(n, "runner", "runners"), strings.Join(unknown, ", "))
	}
	for _, r := range rep.Runners {
		if !r.Orphan {
			continue
		}
		what := fmt.Sprintf("Ollama runner %d", r.PID)
		if r.Model != "" {
			what += " (" + r.Model + ")"
		}
		why := "while Ollama lists no model"
		if r.ServerGone {
			why = "but the ollama serve that started it is gone"
		}
		held := "memory"
		if r.UsedKnown {
			held = human(r.UsedBytes, true)
		}
		fmt.Fprintf(tw, "ORPHAN: %s holds %s %s; only killing it (kill %d) frees the memory\n", what, held, why, r.PID)
	}
	switch {
	case rep.ComfyUIError != "":
		fmt.Fprintln(tw, rep.ComfyUIError)
	case rep.ComfyUI != nil:
		fmt.Fprintln(tw, comfyLine(rep.ComfyUI))
	}
	tw.Flush()
}

// comfyLine says how ComfyUI runs: version, mode, and the partition its
// flags make (or that none does).
func comfyLine(c *comfyReport) string {
	parts := []string{cmp.Or(c.Version, "version unknown"), cmp.Or(c.Mode, "mode unknown")}
	if c.ReserveVRAM != nil {
		parts = append(parts, "--reserve-vram "+human(*c.ReserveVRAM, true))
	} else {
		parts = append(parts, "no --reserve-vram (ComfyUI may take the whole card)")
	}
	if c.VRAMHeadroom != nil {
		parts = append(parts, "--vram-headroom "+human(*c.VRAMHeadroom, true)+" (kept free only while ComfyUI allocates)")
	}
	return fmt.Sprintf("ComfyUI at %s: %s", c.URL, strings.Join(parts, ", "))
}

// servesOf is the SERVES cell of a runner.
func servesOf(r runner, ollamaKnown bool) string {
	switch {
	case r.Orphan && r.Model != "":
		return "ORPHAN (" + r.Model + ")"
	case r.Orphan:
		return "ORPHAN"
	case r.Model != "":
		return r.Model
	case ollamaKnown:
		return "?"
	}
	return "? (Ollama not answering)"
}

// expiry is when a model's keep-alive ends, relative to now.
func expiry(at, now time.Time) string {
	switch d := at.Sub(now); {
	case at.IsZero():
		return "-"
	case d > 100*365*24*time.Hour:
		return "never"
	case d <= 0:
		return "expired, unloading"
	default:
		return "in " + d.Round(time.Second).String()
	}
}

// human formats n in binary units; unknown figures show as "?".
func human(n uint64, known bool) string {
	const (
		kib = 1 << 10
		mib = 1 << 20
		gib = 1 << 30
	)
	switch {
	case !known:
		return "?"
	case n >= gib:
		return fmt.Sprintf("%.1f GiB", float64(n)/gib)
	case n >= mib:
		return fmt.Sprintf("%.1f MiB", float64(n)/mib)
	case n >= kib:
		return fmt.Sprintf("%.1f KiB", float64(n)/kib)
	default:
		return fmt.Sprintf("%d B", n)
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
