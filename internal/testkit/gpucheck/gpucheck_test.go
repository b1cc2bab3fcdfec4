package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/testkit/ollamatest"
)

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name string
		xs   []float64
		want stats
	}{
		{"none", nil, stats{}},
		{"unmeasured only", []float64{-1, -1}, stats{}},
		{"one", []float64{5}, stats{N: 1, MedianMS: 5, P95MS: 5, MaxMS: 5}},
		{"even count", []float64{4, 1, 3, 2}, stats{N: 4, MedianMS: 2.5, P95MS: 4, MaxMS: 4}},
		{"twenty, p95 is the 19th", []float64{20, 19, 18, 17, 16, 15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, -1},
			stats{N: 20, MedianMS: 10.5, P95MS: 19, MaxMS: 20}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := summarize(tc.xs); got != tc.want {
				t.Fatalf("summarize(%v) = %+v, want %+v", tc.xs, got, tc.want)
			}
		})
	}
}

func TestCompareSnapshots(t *testing.T) {
	const gib = 1 << 30
	dev := func(total, used uint64, procs ...vramguard.GPUProcess) vramguard.DeviceMemory {
		return vramguard.DeviceMemory{Index: 0, Name: "NVIDIA H200", UUID: "GPU-1", Total: total, Used: used, Free: total - used,
			Processes: procs, ProcessesKnown: true}
	}
	proc := func(pid uint32, used uint64) vramguard.GPUProcess {
		return vramguard.GPUProcess{PID: pid, UsedBytes: used, UsedKnown: true}
	}
	snap := func(ds ...vramguard.DeviceMemory) *vramguard.VRAMSnapshot {
		return &vramguard.VRAMSnapshot{Devices: ds}
	}
	for _, tc := range []struct {
		name    string
		nv, smi *vramguard.VRAMSnapshot
		want    []string // substrings of the mismatches, in order
	}{
		{"agree, smi rounds to MiB", snap(dev(140*gib, 3*gib, proc(7, 2*gib+5))), snap(dev(140*gib, 3*gib-300<<20, proc(7, 2*gib))), nil},
		{"total differs", snap(dev(140*gib, gib)), snap(dev(139*gib, gib)), []string{"total differs by 1024.0 MiB"}},
		{"process only in nvml", snap(dev(140*gib, gib, proc(7, gib))), snap(dev(140*gib, gib)), []string{"pid 7 in nvml's list only"}},
		{"process only in smi", snap(dev(140*gib, gib)), snap(dev(140*gib, gib, proc(8, gib))), []string{"pid 8 in nvidia-smi's list only"}},
		{"process memory differs", snap(dev(140*gib, gib, proc(7, gib))), snap(dev(140*gib, gib, proc(7, gib/2))), []string{"pid 7 holds"}},
		{"device count", snap(dev(140*gib, gib)), snap(), []string{"nvml lists 1 devices, nvidia-smi 0", "not in nvidia-smi's list"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := compareSnapshots("test", tc.nv, tc.smi).Mismatches
			if len(got) != len(tc.want) {
				t.Fatalf("mismatches %q, want %d like %q", got, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("mismatch %d = %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// TestCPUPath runs the check's CPU path against the real Ollama v0.34.4 and
// the stand-in, as scripts/gpu-check.sh does on a machine without a GPU:
// the server starts, the stand-in loads (holding no device memory, and
// saying so), every mode unloads it, and the summary says the GPU part was
// skipped.
func TestCPUPath(t *testing.T) {
	cache, err := ollamatest.CacheDir()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(cache, "0.34.4", "ollama")
	if _, err := os.Stat(bin); err != nil {
		if ollamatest.InCI() {
			t.Fatalf("ollama v0.34.4 binary unavailable (CI=true makes this a failure): %v", err)
		}
		t.Skipf("ollama v0.34.4 binary unavailable (%v); build it with scripts/install-ollama.sh 0.34.4", err)
	}
	standinBin, err := ollamatest.StandinBinary(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	out := t.TempDir()
	var log bytes.Buffer
	rep := run(t.Context(), config{
		Ollama: bin, OllamaVersion: "0.34.4", Standin: standinBin, Out: out,
		Rounds: 30, CPURounds: 3, DeviceBytes: 64 << 20, Poll: 10 * time.Millisecond, Budget: 2 * time.Minute,
		ForceCPU: true,
	}, &log)
	if err := rep.write(out); err != nil {
		t.Fatal(err)
	}
	txt := rep.text()
	if !rep.Passed || rep.GPU || len(rep.Rounds) != 3 {
		t.Fatalf("passed %v, gpu %v, %d rounds; want a passed CPU run of 3 rounds:\n%s\n%s", rep.Passed, rep.GPU, len(rep.Rounds), txt, &log)
	}
	for _, want := range []string{
		"PASSED (CPU path only)",
		"no NVIDIA GPU: skipped",
		"not held, running without device memory", // the stand-in's own line, from the server's log
		"[ps+runner-processes]",                   // UnloadModel and EnsureFree verified
	} {
		if !strings.Contains(txt, want) {
			t.Errorf("summary lacks %q:\n%s", want, txt)
		}
	}
	var back report
	b, err := os.ReadFile(filepath.Join(out, "gpucheck.json"))
	if err != nil || json.Unmarshal(b, &back) != nil || !back.Passed || back.Skipped == "" {
		t.Fatalf("gpucheck.json: %v\n%s", err, b)
	}
	if _, err := os.Stat(filepath.Join(out, "ollama.log")); err != nil {
		t.Errorf("no server log kept: %v", err)
	}
}
