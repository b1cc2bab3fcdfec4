package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// report is what a check found; it becomes gpucheck.json and gpucheck.txt.
type report struct {
	Started       time.Time          `json:"started"`
	ElapsedMS     float64            `json:"elapsed_ms"`
	GPU           bool               `json:"gpu"`
	Skipped       string             `json:"skipped,omitempty"`
	Passed        bool               `json:"passed"`
	Failures      []string           `json:"failures,omitempty"`
	DeviceBytes   int64              `json:"device_bytes"`
	PollMS        float64            `json:"poll_ms"`
	OllamaVersion string             `json:"ollama_version"`
	Ollama        ollamaInfo         `json:"ollama"`
	StandinSays   string             `json:"standin_says,omitempty"`
	Steps         []step             `json:"steps"`
	Readers       []readerComparison `json:"readers,omitempty"`
	Attribution   *attribution       `json:"attribution,omitempty"`
	Summary       map[string]stats   `json:"summary,omitempty"`
	Rounds        []round            `json:"rounds"`
}

type ollamaInfo struct {
	Reported string  `json:"reported_version,omitempty"`
	PID      int     `json:"pid,omitempty"`
	URL      string  `json:"url,omitempty"`
	StartMS  float64 `json:"start_ms,omitempty"`
}

type step struct {
	Name string  `json:"name"`
	MS   float64 `json:"ms"`
	OK   bool    `json:"ok"`
	Err  string  `json:"err,omitempty"`
}

// round is one load and one freeing of the runner.
type round struct {
	N          int    `json:"n"`
	Mode       string `json:"mode"`
	RunnerPID  uint32 `json:"runner_pid"`
	Device     int    `json:"device"`
	RunnerUsed uint64 `json:"runner_used_bytes,omitempty"`
	Model      string `json:"model,omitempty"`
	Role       string `json:"role,omitempty"`
	Blob       string `json:"blob,omitempty"`
	FreeLoaded uint64 `json:"free_loaded_bytes,omitempty"`
	// LoadMS is the loading generation's time; CallMS the time of the
	// library call (UnloadModel, EnsureFree, or unload request plus
	// AwaitFree) from its start to its return.
	LoadMS float64 `json:"load_ms"`
	CallMS float64 `json:"call_ms"`
	// DriverFreeMS is when, from the call's start, the 10 ms NVML poll
	// first saw the runner gone and the memory back; PIDGoneMS when the
	// runner left the driver's process list (without a GPU: /proc). -1:
	// never seen.
	DriverFreeMS float64 `json:"driver_free_ms"`
	PIDGoneMS    float64 `json:"pid_gone_ms"`
	FreeAtReturn bool    `json:"free_at_return"`
	Verified     bool    `json:"verified"`
	Checked      string  `json:"checked,omitempty"`
	VRAMFreed    int64   `json:"vram_freed_bytes,omitempty"`
	Note         string  `json:"note,omitempty"`
	Err          string  `json:"err,omitempty"`
}

func (r round) verdict() string {
	if r.Err != "" {
		return "FAILED: " + r.Err
	}
	s := "ok"
	if r.Checked != "" {
		s += " [" + r.Checked + "]"
	}
	if r.Model != "" {
		s += fmt.Sprintf(" holder pid %d %s %.0f MiB", r.RunnerPID, r.Model, float64(r.RunnerUsed)/(1<<20))
	}
	return s
}

type readerComparison struct {
	When       string             `json:"when"`
	Devices    []deviceComparison `json:"devices"`
	Mismatches []string           `json:"mismatches,omitempty"`
}

type deviceComparison struct {
	Index        int     `json:"index"`
	Name         string  `json:"name"`
	UUID         string  `json:"uuid"`
	NVML         figures `json:"nvml"`
	SMI          figures `json:"nvidia_smi"`
	TotalDiffMiB float64 `json:"total_diff_mib"`
	UsedDiffMiB  float64 `json:"used_diff_mib"`
	FreeDiffMiB  float64 `json:"free_diff_mib"`
	Note         string  `json:"note,omitempty"`
}

type figures struct {
	Total     uint64       `json:"total"`
	Used      uint64       `json:"used"`
	Free      uint64       `json:"free"`
	Processes []procFigure `json:"processes"`
}

type procFigure struct {
	PID       uint32 `json:"pid"`
	UsedBytes uint64 `json:"used_bytes"`
	UsedKnown bool   `json:"used_known"`
	Role      string `json:"role"`
	Command   string `json:"command,omitempty"`
}

// attribution is the holder as the library names it, in the first round.
type attribution struct {
	PID        uint32 `json:"pid"`
	Model      string `json:"model"`
	Role       string `json:"role"`
	Blob       string `json:"blob"`
	UsedBytes  uint64 `json:"used_bytes"`
	Command    string `json:"command"`
	Device     int    `json:"device"`
	DeviceName string `json:"device_name"`
}

// stats summarise one timing over the rounds that measured it.
type stats struct {
	N        int     `json:"n"`
	MedianMS float64 `json:"median_ms"`
	P95MS    float64 `json:"p95_ms"`
	MaxMS    float64 `json:"max_ms"`
}

// summarize returns the median, the 95th percentile (nearest rank) and
// the maximum of xs, ignoring negative values (not measured).
func summarize(xs []float64) stats {
	var v []float64
	for _, x := range xs {
		if x >= 0 {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return stats{}
	}
	slices.Sort(v)
	n := len(v)
	med := v[n/2]
	if n%2 == 0 {
		med = (v[n/2-1] + v[n/2]) / 2
	}
	rank := int(math.Ceil(0.95*float64(n))) - 1
	return stats{N: n, MedianMS: round1(med), P95MS: round1(v[rank]), MaxMS: round1(v[n-1])}
}

func round1(x float64) float64 { return math.Round(x*10) / 10 }

func ms(d time.Duration) float64 { return round1(float64(d) / float64(time.Millisecond)) }

// summarise fills Summary: per mode and over all rounds, the driver-free
// time, the call time and the runner's exit, over rounds without error.
func (rep *report) summarise() {
	pick := func(mode string, f func(round) float64) []float64 {
		var out []float64
		for _, r := range rep.Rounds {
			if r.Err == "" && (mode == "all" || r.Mode == mode) {
				out = append(out, f(r))
			}
		}
		return out
	}
	rep.Summary = map[string]stats{}
	for _, mode := range append([]string{"all"}, modes[:]...) {
		if s := summarize(pick(mode, func(r round) float64 { return r.DriverFreeMS })); s.N > 0 {
			rep.Summary["driver_free/"+mode] = s
		}
		if s := summarize(pick(mode, func(r round) float64 { return r.CallMS })); s.N > 0 {
			rep.Summary["call/"+mode] = s
		}
		if s := summarize(pick(mode, func(r round) float64 { return r.PIDGoneMS })); s.N > 0 {
			rep.Summary["pid_gone/"+mode] = s
		}
	}
	if s := summarize(pick("all", func(r round) float64 { return r.LoadMS })); s.N > 0 {
		rep.Summary["load"] = s
	}
}

// finish decides Passed: no failure recorded, and on a GPU at least 20
// good rounds, every one free at its return, and the holder named.
func (c *checker) finish() *report {
	rep := c.rep
	good := 0
	for _, r := range rep.Rounds {
		if r.Err == "" {
			good++
		}
	}
	if rep.GPU {
		if good < 20 {
			c.fail("%d good rounds, want at least 20", good)
		}
		if rep.Attribution == nil {
			c.fail("the holder was never named")
		}
	} else if good == 0 {
		c.fail("no round completed on the CPU path")
	}
	rep.Passed = len(rep.Failures) == 0
	return rep
}

// write stores gpucheck.json and gpucheck.txt in dir.
func (rep *report) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "gpucheck.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "gpucheck.txt"), []byte(rep.text()), 0o644)
}

// text is the human summary.
func (rep *report) text() string {
	var b strings.Builder
	verdict := "PASSED"
	switch {
	case !rep.Passed:
		verdict = "FAILED"
	case !rep.GPU:
		verdict = "PASSED (CPU path only)"
	}
	fmt.Fprintf(&b, "vramguard GPU check: %s in %.1f s\n", verdict, rep.ElapsedMS/1000)
	if rep.Skipped != "" {
		fmt.Fprintf(&b, "%s\n", rep.Skipped)
	}
	fmt.Fprintf(&b, "ollama %s (reports %q, pid %d, started in %.0f ms); each runner asked to hold %d MiB of device memory\n",
		rep.OllamaVersion, rep.Ollama.Reported, rep.Ollama.PID, rep.Ollama.StartMS, rep.DeviceBytes>>20)
	if rep.StandinSays != "" {
		fmt.Fprintf(&b, "stand-in: %s\n", rep.StandinSays)
	}
	b.WriteString("steps:\n")
	for _, s := range rep.Steps {
		st := "ok"
		if !s.OK {
			st = "FAILED: " + s.Err
		}
		fmt.Fprintf(&b, "  %-18s %8.0f ms  %s\n", s.Name, s.MS, st)
	}
	for _, rc := range rep.Readers {
		fmt.Fprintf(&b, "readers (%s):\n", rc.When)
		for _, d := range rc.Devices {
			fmt.Fprintf(&b, "  device %d %s: total nvml %d / smi %d (diff %.1f MiB); used diff %.1f MiB; free diff %.1f MiB; processes nvml %d / smi %d %s\n",
				d.Index, d.Name, d.NVML.Total, d.SMI.Total, d.TotalDiffMiB, d.UsedDiffMiB, d.FreeDiffMiB, len(d.NVML.Processes), len(d.SMI.Processes), d.Note)
		}
		for _, m := range rc.Mismatches {
			fmt.Fprintf(&b, "  MISMATCH %s\n", m)
		}
	}
	if a := rep.Attribution; a != nil {
		fmt.Fprintf(&b, "holder: pid %d model %q role %s holds %d MiB on device %d (%s); blob %s; command %q\n",
			a.PID, a.Model, a.Role, a.UsedBytes>>20, a.Device, a.DeviceName, a.Blob, a.Command)
	}
	if len(rep.Summary) > 0 {
		b.WriteString("timings (ms, rounds without error):\n")
		for _, k := range slices.Sorted(maps.Keys(rep.Summary)) {
			s := rep.Summary[k]
			fmt.Fprintf(&b, "  %-20s n=%-3d median %8.1f  p95 %8.1f  max %8.1f\n", k, s.N, s.MedianMS, s.P95MS, s.MaxMS)
		}
	}
	fmt.Fprintf(&b, "rounds: %d\n", len(rep.Rounds))
	for _, r := range rep.Rounds {
		if !rep.GPU {
			fmt.Fprintf(&b, "  %2d %-6s load %6.0f  call %6.0f  runner exit (/proc) %6.0f  %s\n",
				r.N, r.Mode, r.LoadMS, r.CallMS, r.PIDGoneMS, r.verdict())
			continue
		}
		fmt.Fprintf(&b, "  %2d %-6s load %6.0f  call %6.0f  pid gone %6.0f  driver free %6.0f  free at return %-5v %s\n",
			r.N, r.Mode, r.LoadMS, r.CallMS, r.PIDGoneMS, r.DriverFreeMS, r.FreeAtReturn, r.verdict())
	}
	for _, f := range rep.Failures {
		fmt.Fprintf(&b, "FAILURE: %s\n", f)
	}
	return b.String()
}
