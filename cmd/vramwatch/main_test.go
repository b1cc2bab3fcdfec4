package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ollama/ollama/api"
	"go.uber.org/goleak"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/vramguardtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const gib = 1 << 30

// newSim starts a simulator with models of 2 and 3 GiB ("tiny", "small");
// loaded names those to load, with no expiry.
func newSim(t *testing.T, loaded ...string) *vramguardtest.Server {
	t.Helper()
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "tiny", Size: 2 * gib, Chunks: 1, Blob: "sha256:" + hexTiny},
		{Name: "small", Size: 3 * gib, Chunks: 1, Blob: "sha256:" + hexSmall},
	}})
	t.Cleanup(s.Close)
	for _, m := range loaded {
		forever := &api.Duration{Duration: -1}
		err := s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: m, Prompt: "hi", KeepAlive: forever}, func(api.GenerateResponse) error { return nil })
		if err != nil {
			t.Fatalf("load %s: %v", m, err)
		}
	}
	return s
}

// fakeReader reports one device with the given processes.
type fakeReader []vramguard.GPUProcess

func (f fakeReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	d := vramguard.DeviceMemory{Index: 0, Name: "Fake GPU", Total: 16 * gib, ProcessesKnown: true, Processes: []vramguard.GPUProcess(f)}
	for _, p := range f {
		d.Used += p.UsedBytes
	}
	d.Free = d.Total - d.Used
	return &vramguard.VRAMSnapshot{Source: "fake", Taken: time.Now(), Devices: []vramguard.DeviceMemory{d}}, nil
}

// The weights blobs of the simulator's models.
const (
	hexTiny  = "6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"
	hexSmall = "e8ad13eff07a78d89926e9e8b882317d082ef5bf9768ad7b50fcdbbcd63748de"
)

// llamaServer is a v0.34.4 runner of the weights hex, as the NVML reader
// describes it from /proc.
func llamaServer(pid uint32, used uint64, hex string, orphaned bool) vramguard.GPUProcess {
	return vramguard.GPUProcess{PID: pid, UsedBytes: used, UsedKnown: true,
		Command: "/usr/lib/ollama/llama-server --model /root/.ollama/models/blobs/sha256-" + hex + " --port 40125",
		Role:    vramguard.RoleOllamaRunner, Blob: "sha256:" + hex, Orphaned: orphaned}
}

var (
	discovery    = vramguard.GPUProcess{PID: 5150, UsedBytes: 300 << 20, UsedKnown: true, Command: "/usr/lib/ollama/llama-server --list-devices", Role: vramguard.RoleOllamaDiscovery}
	orphanRunner = vramguard.GPUProcess{PID: 4242, UsedBytes: 5 * gib, UsedKnown: true, Command: "/usr/bin/ollama runner --model /blobs/sha256-ab", Role: vramguard.RoleOllamaRunner}
	otherProcess = vramguard.GPUProcess{PID: 777, UsedBytes: 6 * gib, UsedKnown: true, Command: "python main.py", Role: vramguard.RoleOther}
	noGPU        = &vramguard.Error{Op: "new auto reader", Kind: vramguard.KindUnavailable, Err: errors.New("no GPU reader: nvml: library not found; nvidia-smi: not found")}
)

// gpuKind is how a test case gets its GPU reader.
type gpuKind int

const (
	gpuSim       gpuKind = iota // simvram over the test's simulator
	gpuNone                     // NewAutoReader's error
	gpuOrphan                   // a runner holding memory, and another process
	gpuOther                    // another process only
	gpuNamed                    // llama-server runners of tiny and small, and a discovery probe
	gpuGone                     // a runner of small whose server was killed, and one of tiny
	gpuNoneProc                 // NewAutoReader's error; /proc has a runner of tiny (procOne)
	gpuNoneProcs                // NewAutoReader's error; /proc has runners of every kind (procAll)
)

// fakeProc is one process of a fake procfs tree.
type fakeProc struct {
	pid, ppid int
	state     byte // 'S' when zero
	comm      string
	args      []string
}

// procTree writes a procfs tree of ps (each pid's stat and cmdline) and
// returns its root.
func procTree(t *testing.T, ps ...fakeProc) string {
	t.Helper()
	root := t.TempDir()
	for _, p := range ps {
		dir := filepath.Join(root, fmt.Sprint(p.pid))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		state := cmp.Or(p.state, 'S')
		stat := fmt.Sprintf("%d (%s) %c %d %d %d 0 -1 4194560 1 0 0 0\n", p.pid, p.comm, state, p.ppid, p.pid, p.pid)
		cmdline := ""
		for _, a := range p.args {
			cmdline += a + "\x00"
		}
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o444); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(cmdline), 0o444); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// blobPath is where Ollama keeps the weights blob hex.
func blobPath(hex string) string { return "/root/.ollama/models/blobs/sha256-" + hex }

var (
	procInit   = fakeProc{pid: 1, comm: "systemd", args: []string{"/sbin/init"}}
	procServer = fakeProc{pid: 100, ppid: 1, comm: "ollama", args: []string{"/usr/local/bin/ollama", "serve"}}
	// procOne: the server and its runner of tiny.
	procOne = []fakeProc{procInit, procServer,
		{pid: 4001, ppid: 100, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--model", blobPath(hexTiny), "--port", "40125"}}}
	// procAll: those, and a runner of small whose server is gone (init
	// adopted it), the MLX runner of a model it names, a runner of a file
	// that is no blob, a discovery probe and another program.
	procAll = append(slices.Clip(procOne),
		fakeProc{pid: 3999, ppid: 1, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--model", blobPath(hexSmall), "--port", "40126"}},
		fakeProc{pid: 4005, ppid: 100, comm: "ollama", args: []string{"/usr/local/bin/ollama", "runner", "--model", "qwen3:latest", "--port", "40127"}},
		fakeProc{pid: 4006, ppid: 100, comm: "ollama", args: []string{"/usr/local/bin/ollama", "runner", "--model", "/opt/models/mine.gguf", "--port", "40128"}},
		fakeProc{pid: 5150, ppid: 100, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--list-devices"}},
		fakeProc{pid: 777, ppid: 1, comm: "python3", args: []string{"python", "main.py"}},
	)
)

// procRoot is the procfs tree the case's runners are read from without a
// GPU snapshot: an empty one unless the kind names runners.
func (g gpuKind) procRoot(t *testing.T) string {
	switch g {
	case gpuNoneProc:
		return procTree(t, procOne...)
	case gpuNoneProcs:
		return procTree(t, procAll...)
	}
	return t.TempDir()
}

func (g gpuKind) open(s *vramguardtest.Server) func(context.Context) (vramguard.VRAMReader, error) {
	return func(context.Context) (vramguard.VRAMReader, error) {
		switch g {
		case gpuSim:
			return &vramguardtest.GPU{Server: s}, nil
		case gpuOrphan:
			return fakeReader{otherProcess, orphanRunner}, nil
		case gpuOther:
			return fakeReader{otherProcess}, nil
		case gpuNamed:
			return fakeReader{llamaServer(4001, 2*gib, hexTiny, false), llamaServer(4002, 3*gib, hexSmall, false), discovery}, nil
		case gpuGone:
			return fakeReader{llamaServer(4001, 2*gib, hexTiny, false), llamaServer(3999, 3*gib, hexSmall, true)}, nil
		}
		return nil, noGPU
	}
}

// invoke runs the command and returns its exit status, stdout and stderr;
// the host in stdout is replaced by HOST.
func invoke(ctx context.Context, t *testing.T, s *vramguardtest.Server, g gpuKind, stdout *safeBuffer, tty bool, args ...string) (code int, out, errOut string) {
	t.Helper()
	if stdout == nil {
		stdout = &safeBuffer{}
	}
	var stderr bytes.Buffer
	c := &cmd{stdout: stdout, stderr: &stderr, getenv: func(string) string { return "" }, tty: tty, newReader: g.open(s), procRoot: g.procRoot(t)}
	code = c.main(ctx, append([]string{"-host", s.URL().String()}, args...))
	return code, strings.ReplaceAll(stdout.String(), s.URL().String(), "HOST"), stderr.String()
}

func TestOnce(t *testing.T) {
	tests := []struct {
		name    string
		loaded  []string
		reserve uint64 // bytes another process holds on the simulated GPU
		gpu     gpuKind
		down    bool // Ollama does not answer
		code    int
		want    string   // the whole output, when set
		lines   []string // lines the output must contain
		not     []string // texts it must not contain
	}{
		{
			name: "one model", loaded: []string{"tiny"}, reserve: 6 * gib,
			want: `GPU 0  Simulated GPU  8.0 GiB used of 24.0 GiB, 16.0 GiB free  (simulated)
  PID    MEMORY   ROLE           SERVES       COMMAND
  40001  2.0 GiB  ollama runner  tiny:latest  ollama runner (tiny:latest)
  40002  6.0 GiB  other          -            comfyui

Ollama at HOST: 1 model loaded
  MODEL        SIZE     VRAM     EXPIRES  RUNNER
  tiny:latest  2.0 GiB  2.0 GiB  never    40001
`,
		},
		{
			// The simulated GPU names each runner's model, as
			// gpu.NameRunners does for a real one.
			name: "two models", loaded: []string{"tiny", "small"},
			lines: []string{
				"  40001  2.0 GiB  ollama runner  tiny:latest   ollama runner (tiny:latest)",
				"  40002  3.0 GiB  ollama runner  small:latest  ollama runner (small:latest)",
				"Ollama at HOST: 2 models loaded",
				"  small:latest  3.0 GiB  3.0 GiB  never    40002",
				"  tiny:latest   2.0 GiB  2.0 GiB  never    40001",
			},
			not: []string{"ORPHAN", "not known"},
		},
		{
			name: "nothing loaded", gpu: gpuSim,
			lines: []string{"GPU 0  Simulated GPU  0 B used of 24.0 GiB, 24.0 GiB free  (simulated)", "  (no process holds memory)", "Ollama at HOST: 0 models loaded"},
		},
		{
			name: "no GPU", loaded: []string{"tiny"}, gpu: gpuNone,
			want: `no GPU reader: nvml: library not found; nvidia-smi: not found

Ollama at HOST: 1 model loaded
  MODEL        SIZE     VRAM     EXPIRES  RUNNER
  tiny:latest  2.0 GiB  2.0 GiB  never    ?
`,
		},
		{
			// The runner column names the runner /proc shows for the
			// model, with no GPU to list it.
			name: "no GPU, a runner in /proc", loaded: []string{"tiny"}, gpu: gpuNoneProc,
			want: `no GPU reader: nvml: library not found; nvidia-smi: not found
Ollama runners (from /proc; memory not known):
  PID   SERVES
  4001  tiny:latest

Ollama at HOST: 1 model loaded
  MODEL        SIZE     VRAM     EXPIRES  RUNNER
  tiny:latest  2.0 GiB  2.0 GiB  never    4001
`,
		},
		{
			name: "no GPU, runners of every kind in /proc", loaded: []string{"tiny"}, gpu: gpuNoneProcs,
			want: `no GPU reader: nvml: library not found; nvidia-smi: not found
Ollama runners (from /proc; memory not known):
  PID   SERVES
  3999  ORPHAN (small:latest)
  4001  tiny:latest
  4005  qwen3:latest
  4006  ?

Ollama at HOST: 1 model loaded
  MODEL        SIZE     VRAM     EXPIRES  RUNNER
  tiny:latest  2.0 GiB  2.0 GiB  never    4001
  runner 4006: which serves which model is not known
ORPHAN: Ollama runner 3999 (small:latest) holds memory but the ollama serve that started it is gone; only killing it (kill 3999) frees the memory
`,
		},
		{
			name: "no GPU, runners in /proc, Ollama down", gpu: gpuNoneProcs, down: true, code: 1,
			lines: []string{
				"  3999  ORPHAN",
				"  4001  ? (Ollama not answering)",
				"  4005  qwen3:latest",
				"  4006  ? (Ollama not answering)",
				"Ollama at HOST does not answer: ",
				"  runners 4001, 4006: which serves which model is not known",
				"ORPHAN: Ollama runner 3999 holds memory but the ollama serve that started it is gone",
			},
			not: []string{"5150", "777"},
		},
		{
			name: "no Ollama", gpu: gpuOther, down: true,
			lines: []string{"GPU 0  Fake GPU  6.0 GiB used of 16.0 GiB, 10.0 GiB free  (fake)", "  777  6.0 GiB  other  -       python main.py", "Ollama at HOST does not answer: list running: "},
		},
		{
			name: "runner without Ollama is not an orphan", gpu: gpuOrphan, down: true,
			lines: []string{"  4242  5.0 GiB  ollama runner  ? (Ollama not answering)  /usr/bin/ollama runner --model /blobs/sha256-ab", "  runner 4242 (5.0 GiB): which serves which model is not known"},
			not:   []string{"ORPHAN"},
		},
		{
			name: "orphan", gpu: gpuOrphan,
			lines: []string{
				"  777   6.0 GiB  other          -       python main.py",
				"  4242  5.0 GiB  ollama runner  ORPHAN  /usr/bin/ollama runner --model /blobs/sha256-ab",
				"Ollama at HOST: 0 models loaded",
				"ORPHAN: Ollama runner 4242 holds 5.0 GiB while Ollama lists no model; only killing it (kill 4242) frees the memory",
			},
			not: []string{"not known"},
		},
		{
			name: "model on the CPU", loaded: []string{"tiny"}, gpu: gpuOther,
			lines: []string{"  tiny:latest  2.0 GiB  2.0 GiB  never    -"},
		},
		{name: "neither side", gpu: gpuNone, down: true, code: 1, lines: []string{"no GPU reader: ", "Ollama at HOST does not answer: "}},
		{
			name: "runners named through their blobs", loaded: []string{"tiny", "small"}, gpu: gpuNamed,
			lines: []string{
				"  4002  3.0 GiB    ollama runner     small:latest  /usr/lib/ollama/llama-server --model /root/.ollama/models/blobs/sha256-" + hexSmall + " --port 40125",
				"  4001  2.0 GiB    ollama runner     tiny:latest   /usr/lib/ollama/llama-server --model",
				"  5150  300.0 MiB  ollama discovery  -             /usr/lib/ollama/llama-server --list-devices",
				"  small:latest  3.0 GiB  3.0 GiB  never    4002",
				"  tiny:latest   2.0 GiB  2.0 GiB  never    4001",
			},
			not: []string{"not known", "ORPHAN", "5150 (", "not named"},
		},
		{
			name: "a load in flight is named too", loaded: []string{"tiny"}, gpu: gpuNamed,
			lines: []string{"  4002  3.0 GiB    ollama runner     small:latest", "  tiny:latest  2.0 GiB  2.0 GiB  never    4001"},
			not:   []string{"not known", "ORPHAN"},
		},
		{
			name: "runner whose server is gone, models listed", loaded: []string{"tiny"}, gpu: gpuGone,
			lines: []string{
				"  3999  3.0 GiB  ollama runner  ORPHAN (small:latest)",
				"  4001  2.0 GiB  ollama runner  tiny:latest",
				"ORPHAN: Ollama runner 3999 (small:latest) holds 3.0 GiB but the ollama serve that started it is gone; only killing it (kill 3999) frees the memory",
			},
			not: []string{"4001 holds", "not known"},
		},
		{
			name: "runner whose server is gone, Ollama down", gpu: gpuGone, down: true,
			lines: []string{
				"  3999  3.0 GiB  ollama runner  ORPHAN",
				"  4001  2.0 GiB  ollama runner  ? (Ollama not answering)",
				"ORPHAN: Ollama runner 3999 holds 3.0 GiB but the ollama serve that started it is gone; only killing it (kill 3999) frees the memory",
				"  runner 4001 (2.0 GiB): which serves which model is not known",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, tt.loaded...)
			if tt.reserve > 0 {
				if err := s.Reserve("comfyui", tt.reserve); err != nil {
					t.Fatal(err)
				}
			}
			if tt.down {
				s.Close()
			}
			code, out, stderr := invoke(t.Context(), t, s, tt.gpu, nil, false, "-once")
			if code != tt.code {
				t.Errorf("exit %d, want %d; stderr %q", code, tt.code, stderr)
			}
			if tt.code == 0 && stderr != "" {
				t.Errorf("stderr %q, want nothing", stderr)
			}
			if tt.code != 0 && !strings.Contains(stderr, "unavailable: neither the GPU nor Ollama could be read") {
				t.Errorf("stderr %q does not say that nothing could be read", stderr)
			}
			if tt.want != "" && out != tt.want {
				t.Errorf("output:\n%s\nwant:\n%s", out, tt.want)
			}
			lines := strings.Split(out, "\n")
			for _, l := range tt.lines {
				found := false
				for _, got := range lines {
					found = found || strings.HasPrefix(got, l)
				}
				if !found {
					t.Errorf("no line starts with %q in:\n%s", l, out)
				}
			}
			for _, n := range tt.not {
				if strings.Contains(out, n) {
					t.Errorf("output contains %q:\n%s", n, out)
				}
			}
		})
	}
}

func TestJSON(t *testing.T) {
	tests := []struct {
		name   string
		loaded []string
		gpu    gpuKind
		check  func(t *testing.T, r *report)
	}{
		{
			name: "one model", loaded: []string{"tiny"},
			check: func(t *testing.T, r *report) {
				if r.GPU == nil || r.GPU.Source != vramguardtest.GPUSource || len(r.GPU.Devices) != 1 || len(r.GPU.Devices[0].Processes) != 1 {
					t.Fatalf("gpu = %+v, want one simulated device with one process", r.GPU)
				}
				if r.Ollama == nil || len(r.Ollama.Models) != 1 {
					t.Fatalf("ollama = %+v, want one model", r.Ollama)
				}
				m := r.Ollama.Models[0]
				if m.Name != "tiny:latest" || m.Size != 2*gib || m.SizeVRAM != 2*gib || m.RunnerPID != 40001 || m.ExpiresAt.Before(time.Now().AddDate(100, 0, 0)) {
					t.Errorf("model = %+v", m)
				}
				if len(r.Runners) != 1 || r.Runners[0] != (runner{PID: 40001, UsedBytes: 2 * gib, UsedKnown: true, Model: "tiny:latest"}) {
					t.Errorf("runners = %+v", r.Runners)
				}
			},
		},
		{
			name: "orphan", gpu: gpuOrphan,
			check: func(t *testing.T, r *report) {
				if r.Ollama == nil || r.Ollama.Models == nil || len(r.Ollama.Models) != 0 {
					t.Errorf("ollama = %+v, want an empty model list", r.Ollama)
				}
				if len(r.Runners) != 1 || r.Runners[0] != (runner{PID: 4242, UsedBytes: 5 * gib, UsedKnown: true, Orphan: true}) {
					t.Errorf("runners = %+v, want the orphan", r.Runners)
				}
			},
		},
		{
			name: "named runners, discovery and a gone server", loaded: []string{"tiny"}, gpu: gpuGone,
			check: func(t *testing.T, r *report) {
				want := []runner{
					{PID: 3999, UsedBytes: 3 * gib, UsedKnown: true, Model: "small:latest", Orphan: true, ServerGone: true},
					{PID: 4001, UsedBytes: 2 * gib, UsedKnown: true, Model: "tiny:latest"},
				}
				if !reflect.DeepEqual(r.Runners, want) {
					t.Errorf("runners = %+v, want %+v", r.Runners, want)
				}
				if m := r.Ollama.Models; len(m) != 1 || m[0].RunnerPID != 4001 {
					t.Errorf("models = %+v, want tiny served by 4001", m)
				}
				if p := r.GPU.Devices[0].Processes; len(p) != 2 || p[0].Blob != "sha256:"+hexTiny {
					t.Errorf("processes = %+v, want the blobs", p)
				}
			},
		},
		{
			name: "discovery is no runner", loaded: []string{"tiny", "small"}, gpu: gpuNamed,
			check: func(t *testing.T, r *report) {
				if len(r.Runners) != 2 || slices.ContainsFunc(r.Runners, func(x runner) bool { return x.PID == 5150 }) {
					t.Errorf("runners = %+v, want the two runners only", r.Runners)
				}
				if p := r.GPU.Devices[0].Processes; len(p) != 3 || p[2].Role != "ollama discovery" {
					t.Errorf("processes = %+v, want the discovery probe listed as such", p)
				}
			},
		},
		{
			name: "no GPU", loaded: []string{"small"}, gpu: gpuNone,
			check: func(t *testing.T, r *report) {
				if r.GPU != nil || r.GPUError != "no GPU reader: nvml: library not found; nvidia-smi: not found" {
					t.Errorf("gpu = %+v, gpu_error = %q", r.GPU, r.GPUError)
				}
				if r.Runners == nil || len(r.Runners) != 0 || r.Ollama.Models[0].RunnerPID != 0 {
					t.Errorf("runners = %#v, runner pid %d; want none", r.Runners, r.Ollama.Models[0].RunnerPID)
				}
			},
		},
		{
			name: "no GPU, runners in /proc", loaded: []string{"tiny"}, gpu: gpuNoneProcs,
			check: func(t *testing.T, r *report) {
				if r.GPU != nil || !strings.HasPrefix(r.GPUError, "no GPU reader: ") {
					t.Errorf("gpu = %+v, gpu_error = %q", r.GPU, r.GPUError)
				}
				want := []runner{
					{PID: 3999, Model: "small:latest", Orphan: true, ServerGone: true},
					{PID: 4001, Model: "tiny:latest"},
					{PID: 4005, Model: "qwen3:latest"},
					{PID: 4006},
				}
				if !reflect.DeepEqual(r.Runners, want) {
					t.Errorf("runners = %+v, want %+v", r.Runners, want)
				}
				if m := r.Ollama.Models; len(m) != 1 || m[0].RunnerPID != 4001 {
					t.Errorf("models = %+v, want tiny served by 4001", m)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, tt.loaded...)
			code, out, stderr := invoke(t.Context(), t, s, tt.gpu, nil, false, "-once", "-json")
			if code != 0 || stderr != "" {
				t.Fatalf("exit %d, stderr %q", code, stderr)
			}
			if strings.Count(out, "\n") != 1 || !strings.HasSuffix(out, "\n") {
				t.Errorf("output is not one line: %q", out)
			}
			dec := json.NewDecoder(strings.NewReader(out))
			dec.DisallowUnknownFields()
			var r report
			if err := dec.Decode(&r); err != nil {
				t.Fatalf("decode %q: %v", out, err)
			}
			if r.Time.IsZero() {
				t.Error("no time")
			}
			tt.check(t, &r)
		})
	}
}

// safeBuffer is a stdout that counts writes (one per table or JSON object)
// and calls onWrite after each.
type safeBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	writes  int
	onWrite func(n int)
}

func (b *safeBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.b.Write(p)
	b.writes++
	if b.onWrite != nil {
		b.onWrite(b.writes)
	}
	return n, err
}

func (b *safeBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

func TestLive(t *testing.T) {
	tests := []struct {
		name  string
		args  []string
		tty   bool
		gpu   gpuKind
		check func(t *testing.T, out string)
	}{
		{
			name: "pipe", check: func(t *testing.T, out string) {
				if got := strings.Count(out, "\n\nvramwatch  "); got != 2 || !strings.HasPrefix(out, "vramwatch  ") || strings.Count(out, "\nGPU 0  Simulated GPU") != 3 {
					t.Errorf("want 3 tables separated by blank lines, got:\n%s", out)
				}
				if strings.Contains(out, "\x1b") {
					t.Errorf("escape sequence written to a pipe: %q", out)
				}
			},
		},
		{
			name: "terminal", tty: true, check: func(t *testing.T, out string) {
				if got := strings.Count(out, "\x1b[H\x1b[2Jvramwatch  "); got != 3 || !strings.Contains(out, "every 100ms, Ctrl-C quits") {
					t.Errorf("want 3 screens, got %d:\n%q", got, out)
				}
			},
		},
		{
			// The reader is missing for the whole run: the first table
			// says so, the others show only what changes.
			name: "pipe without a GPU", gpu: gpuNoneProc, check: func(t *testing.T, out string) {
				if got := strings.Count(out, "no GPU reader"); got != 1 || !strings.HasPrefix(out, "vramwatch  ") || !strings.Contains(out, "\nno GPU reader: nvml: library not found; nvidia-smi: not found\n") {
					t.Errorf("want the no GPU reader line once, in the first table; got %d in:\n%s", got, out)
				}
				for _, l := range []string{"\nOllama runners (from /proc; memory not known):\n", "\n  4001  tiny:latest\n", "\n  tiny:latest  2.0 GiB  2.0 GiB  never    4001\n"} {
					if got := strings.Count(out, l); got != 3 {
						t.Errorf("%q %d times, want once a table:\n%s", l, got, out)
					}
				}
			},
		},
		{
			// Each screen replaces the last: the line is on each, so one
			// is always in view.
			name: "terminal without a GPU", tty: true, gpu: gpuNoneProc, check: func(t *testing.T, out string) {
				screens := strings.Split(out, "\x1b[H\x1b[2J")[1:]
				if len(screens) != 3 {
					t.Fatalf("want 3 screens, got %d:\n%q", len(screens), out)
				}
				for i, sc := range screens {
					if strings.Count(sc, "no GPU reader") != 1 || !strings.Contains(sc, "\n  4001  tiny:latest\n") {
						t.Errorf("screen %d:\n%s", i, sc)
					}
				}
			},
		},
		{
			name: "json", args: []string{"-json"}, tty: true, check: func(t *testing.T, out string) {
				lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
				if len(lines) != 3 {
					t.Fatalf("want 3 lines, got %q", out)
				}
				for _, l := range lines {
					var r report
					if err := json.Unmarshal([]byte(l), &r); err != nil || r.Ollama == nil || len(r.Ollama.Models) != 1 {
						t.Errorf("line %q: %v, report %+v", l, err, r)
					}
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t, "tiny")
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			out := &safeBuffer{onWrite: func(n int) {
				if n == 3 {
					cancel() // what Ctrl-C does through signal.NotifyContext
				}
			}}
			start := time.Now()
			code, _, stderr := invoke(ctx, t, s, tt.gpu, out, tt.tty, append([]string{"-interval", "100ms"}, tt.args...)...)
			if code != 0 || stderr != "" {
				t.Errorf("exit %d, stderr %q; want 0 and nothing", code, stderr)
			}
			if d := time.Since(start); d < 150*time.Millisecond {
				t.Errorf("3 refreshes in %v, want about 200ms", d)
			}
			tt.check(t, out.String())
		})
	}
}

func TestUsage(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{name: "help", args: []string{"-h"}, code: 0, stderr: "usage: vramwatch [flags]\n"},
		{name: "help, long", args: []string{"-help"}, code: 0, stderr: "usage: vramwatch [flags]\n"},
		{name: "help, two dashes", args: []string{"--help"}, code: 0, stderr: "usage: vramwatch [flags]\n"},
		{name: "help after flags", args: []string{"-once", "-json", "-h"}, code: 0, stderr: "usage: vramwatch [flags]\n"},
		{name: "unknown flag", args: []string{"-all"}, code: 2, stderr: "vramwatch: usage: invalid input: flag provided but not defined: -all (see vramwatch -h)\n"},
		{name: "argument", args: []string{"-once", "gpu0"}, code: 2, stderr: `vramwatch: usage: invalid input: unexpected argument "gpu0" (see vramwatch -h)` + "\n"},
		{name: "interval too short", args: []string{"-interval", "10ms"}, code: 2, stderr: "vramwatch: usage: invalid input: -interval 10ms: want 100ms or more\n"},
		{name: "bad host", args: []string{"-host", "ftp://x", "-once"}, code: 2, stderr: "vramwatch: new client: invalid input: "},
		{name: "listen and once", args: []string{"-listen", "127.0.0.1:0", "-once"}, code: 2, stderr: "vramwatch: usage: invalid input: -listen serves HTTP: -once and -json are for the table\n"},
		{name: "listen on a bad address", args: []string{"-listen", "127.0.0.1:http-nope"}, code: 1, stderr: "vramwatch: listen: unavailable: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newSim(t)
			code, out, stderr := invoke(t.Context(), t, s, gpuSim, nil, false, tt.args...)
			if code != tt.code || out != "" || !strings.HasPrefix(stderr, tt.stderr) {
				t.Errorf("exit %d, stdout %q, stderr %q; want %d, nothing, %q", code, out, stderr, tt.code, tt.stderr)
			}
			if tt.code != 0 && strings.Count(stderr, "\n") != 1 {
				t.Errorf("stderr %q is not one line", stderr)
			}
			if tt.code == 0 {
				for _, f := range []string{"-host URL", "-interval", "-once", "-json", "-listen ADDR", "-gpu"} {
					if !strings.Contains(stderr, "\n  "+f) {
						t.Errorf("usage %q does not list %s", stderr, f)
					}
				}
			}
		})
	}
}

func TestExpiry(t *testing.T) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		at   time.Time
		want string
	}{
		{name: "zero", want: "-"},
		{name: "soon", at: now.Add(4*time.Minute + 59*time.Second + 400*time.Millisecond), want: "in 4m59s"},
		{name: "past", at: now.Add(-time.Second), want: "expired, unloading"},
		{name: "now", at: now, want: "expired, unloading"},
		{name: "forever", at: now.Add(1<<63 - 1), want: "never"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := expiry(tt.at, now); got != tt.want {
				t.Errorf("expiry = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestHuman(t *testing.T) {
	tests := []struct {
		n     uint64
		known bool
		want  string
	}{
		{0, true, "0 B"},
		{1023, true, "1023 B"},
		{1536, true, "1.5 KiB"},
		{300 << 20, true, "300.0 MiB"},
		{24 << 30, true, "24.0 GiB"},
		{5, false, "?"},
	}
	for _, tt := range tests {
		if got := human(tt.n, tt.known); got != tt.want {
			t.Errorf("human(%d, %v) = %q, want %q", tt.n, tt.known, got, tt.want)
		}
	}
}

func TestProcRunners(t *testing.T) {
	llama := func(pid, ppid int, model string) fakeProc {
		return fakeProc{pid: pid, ppid: ppid, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--model", model, "--port", "40125"}}
	}
	tiny := blobPath(hexTiny)
	tests := []struct {
		name  string
		procs []fakeProc
		want  []vramguard.GPUProcess // Command and Role left out
	}{
		{name: "none", procs: []fakeProc{procInit, procServer}},
		{
			name:  "runner of a live server",
			procs: []fakeProc{procInit, procServer, llama(4001, 100, tiny)},
			want:  []vramguard.GPUProcess{{PID: 4001, Blob: "sha256:" + hexTiny}},
		},
		{
			name:  "adopted by init",
			procs: []fakeProc{procInit, llama(4001, 1, tiny)},
			want:  []vramguard.GPUProcess{{PID: 4001, Blob: "sha256:" + hexTiny, Orphaned: true}},
		},
		{
			name:  "parent gone",
			procs: []fakeProc{llama(4001, 99, tiny)},
			want:  []vramguard.GPUProcess{{PID: 4001, Blob: "sha256:" + hexTiny, Orphaned: true}},
		},
		{
			name:  "parent a zombie",
			procs: []fakeProc{{pid: 100, ppid: 1, state: 'Z', comm: "ollama"}, llama(4001, 100, tiny)},
			want:  []vramguard.GPUProcess{{PID: 4001, Blob: "sha256:" + hexTiny, Orphaned: true}},
		},
		{
			name:  "parent outside the namespace",
			procs: []fakeProc{llama(4001, 0, tiny)},
			want:  []vramguard.GPUProcess{{PID: 4001, Blob: "sha256:" + hexTiny}},
		},
		{
			name:  "parent's command line unreadable",
			procs: []fakeProc{{pid: 100, ppid: 1, comm: "ollama"}, llama(4001, 100, tiny)},
			want:  []vramguard.GPUProcess{{PID: 4001, Blob: "sha256:" + hexTiny}},
		},
		{
			name: "flag forms and the last --model",
			procs: []fakeProc{procServer,
				{pid: 4001, ppid: 100, comm: "ollama", args: []string{"/usr/bin/ollama", "runner", "--model=" + tiny, "--port", "1"}},
				{pid: 4002, ppid: 100, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "-m", blobPath(hexTiny), "-m", blobPath(strings.ToUpper(hexSmall))}},
				{pid: 4003, ppid: 100, comm: "ollama_llama_se", args: []string{"/usr/lib/ollama/runners/cuda_v12/ollama_llama_server", "--model", `C:\\ollama\\blobs\\sha256:` + hexSmall}},
			},
			want: []vramguard.GPUProcess{{PID: 4001, Blob: "sha256:" + hexTiny}, {PID: 4002, Blob: "sha256:" + hexSmall}, {PID: 4003, Blob: "sha256:" + hexSmall}},
		},
		{
			name:  "one string",
			procs: []fakeProc{procServer, {pid: 4001, ppid: 100, comm: "ollama", args: []string{"/usr/bin/ollama runner --model " + tiny + " --port 1"}}},
			want:  []vramguard.GPUProcess{{PID: 4001, Blob: "sha256:" + hexTiny}},
		},
		{
			name: "named or not named",
			procs: []fakeProc{procServer,
				{pid: 4005, ppid: 100, comm: "ollama", args: []string{"/usr/bin/ollama", "runner", "--model", "hf.co/org/repo:Q4_K_M"}},
				{pid: 4006, ppid: 100, comm: "ollama", args: []string{"/usr/bin/ollama", "runner", "--model", "mine.gguf"}},
				{pid: 4007, ppid: 100, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--model", "qwen3:latest"}},
			},
			want: []vramguard.GPUProcess{{PID: 4005, Model: "hf.co/org/repo:Q4_K_M"}, {PID: 4006}, {PID: 4007}},
		},
		{
			name: "not runners",
			procs: []fakeProc{procServer,
				{pid: 5150, ppid: 100, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--list-devices"}},
				{pid: 5151, ppid: 100, comm: "ollama", args: []string{"/usr/bin/ollama", "runner", "--ollama-engine", "--port", "2"}},
				{pid: 6000, ppid: 1, comm: "llama-server", args: []string{"/opt/llama.cpp/llama-server", "--model", "/data/mine.gguf"}},
				{pid: 6001, ppid: 1, comm: "ollama", args: []string{"ollama", "run", "tiny"}},
				// Named like no Ollama process: its command line is not read.
				{pid: 6002, ppid: 100, comm: "(sd-pam) x", args: []string{"/usr/bin/ollama", "runner", "--model", tiny}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := procRunners(procTree(t, tt.procs...))
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				if got[i].Role != vramguard.RoleOllamaRunner || got[i].UsedKnown || got[i].Command == "" {
					t.Errorf("%+v: want a runner, memory not known, with its command", got[i])
				}
				got[i].Role, got[i].Command = 0, ""
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("runners = %+v, want %+v", got, tt.want)
			}
		})
	}
	if _, err := procRunners(filepath.Join(t.TempDir(), "absent")); err == nil {
		t.Error("no error for a procfs root that does not exist")
	}
}

// TestComfyUINamed: with -comfyui and its PID, ComfyUI's process is named
// "ComfyUI" among the holders (its command line was "python main.py");
// -comfyui-pid alone is a usage error.
func TestComfyUINamed(t *testing.T) {
	s := newSim(t)
	if err := s.Reserve("python main.py", 6*gib); err != nil {
		t.Fatal(err)
	}
	var pid uint32
	for _, h := range s.Holders() {
		if h.Name == "python main.py" {
			pid = h.PID
		}
	}
	code, out, errOut := invoke(t.Context(), t, s, gpuSim, nil, false, "-once", "-comfyui", "http://127.0.0.1:1", "-comfyui-pid", fmt.Sprint(pid))
	if code != 0 || !strings.Contains(out, fmt.Sprintf("%d  6.0 GiB  other  -       ComfyUI\n", pid)) || strings.Contains(out, "python main.py") {
		t.Errorf("exit %d, stderr %q, output\n%s\nwant ComfyUI's process named", code, errOut, out)
	}
	if code, _, errOut := invoke(t.Context(), t, s, gpuSim, nil, false, "-once", "-comfyui-pid", "7"); code != 2 || !strings.Contains(errOut, "-comfyui too") {
		t.Errorf("-comfyui-pid alone: exit %d, %q; want a usage error", code, errOut)
	}
}

// TestComfyUILaunchShown: with -comfyui, vramwatch shows how ComfyUI runs
// from its /system_stats: the mode and the --reserve-vram and
// --vram-headroom its argv gives, in the table and in the JSON; a
// ComfyUI started without --reserve-vram is said to have no partition.
func TestComfyUILaunchShown(t *testing.T) {
	s := newSim(t)
	for _, tt := range []struct {
		name string
		cfg  comfyuitest.Config
		want []string
	}{
		{"flags", comfyuitest.Config{ReserveVRAM: 10 * gib, VRAMHeadroom: gib / 2},
			[]string{"0.25.0, DynamicVRAM, --reserve-vram 10.0 GiB, --vram-headroom 512.0 MiB (kept free only while ComfyUI allocates)"}},
		{"none", comfyuitest.Config{Mode: comfyuitest.ModelPatcher}, []string{"0.3.64, ModelPatcher, no --reserve-vram (ComfyUI may take the whole card)"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, err := comfyuitest.NewServer(s, tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			args := []string{"-once", "-comfyui", f.URL().String(), "-comfyui-pid", fmt.Sprint(f.PID())}
			code, out, errOut := invoke(t.Context(), t, s, gpuSim, nil, false, args...)
			want := "ComfyUI at " + f.URL().String() + ": " + tt.want[0] + "\n"
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("exit %d, stderr %q, output\n%s\nwant the line %q", code, errOut, out, want)
			}
			code, out, _ = invoke(t.Context(), t, s, gpuSim, nil, false, append(args, "-json")...)
			var rep struct {
				ComfyUI struct {
					Mode         string  `json:"mode"`
					ReserveVRAM  *uint64 `json:"reserve_vram"`
					VRAMHeadroom *uint64 `json:"vram_headroom"`
				} `json:"comfyui"`
			}
			if err := json.Unmarshal([]byte(out), &rep); err != nil || code != 0 {
				t.Fatalf("-json: exit %d, %v: %s", code, err, out)
			}
			if rep.ComfyUI.Mode != tt.cfg.Mode.String() || (rep.ComfyUI.ReserveVRAM != nil) != (tt.cfg.ReserveVRAM > 0) ||
				(rep.ComfyUI.ReserveVRAM != nil && *rep.ComfyUI.ReserveVRAM != tt.cfg.ReserveVRAM) ||
				(rep.ComfyUI.VRAMHeadroom != nil && *rep.ComfyUI.VRAMHeadroom != tt.cfg.VRAMHeadroom) {
				t.Errorf("-json comfyui %+v; want mode %v, reserve %d, headroom %d", rep.ComfyUI, tt.cfg.Mode, tt.cfg.ReserveVRAM, tt.cfg.VRAMHeadroom)
			}
		})
	}
}
