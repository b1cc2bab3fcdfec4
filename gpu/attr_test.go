package gpu

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/vramguard/vramguard"
)

// Real-looking weights blobs.
const (
	attrHexA = "6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"
	attrHexB = "e8ad13eff07a78d89926e9e8b882317d082ef5bf9768ad7b50fcdbbcd63748de"
)

func TestAttrClassifyCommand(t *testing.T) {
	v17 := "/root/.cache/vramguard/ollama/0.17.4/ollama"
	tests := []struct {
		name string
		args []string
		want vramguard.ProcessRole
	}{
		{"nil", nil, vramguard.RoleUnknown},
		{"empty", []string{""}, vramguard.RoleUnknown},
		{"server", []string{"/usr/local/bin/ollama", "serve"}, vramguard.RoleOllamaServer},
		{"server with global flag", []string{"ollama", "--verbose", "serve"}, vramguard.RoleOllamaServer},
		{"server on Windows", []string{`C:\Users\ada\AppData\Local\Programs\Ollama\ollama.exe`, "serve"}, vramguard.RoleOllamaServer},
		{"v0.17.4 runner", []string{v17, "runner", "--model", "/tmp/x/models/blobs/sha256-" + attrHexA, "--port", "40123"}, vramguard.RoleOllamaRunner},
		{"v0.17.4 new engine runner", []string{v17, "runner", "--ollama-engine", "--model", "/tmp/x/models/blobs/sha256-" + attrHexA, "--port", "40123"}, vramguard.RoleOllamaRunner},
		{"v0.24.0 discovery", []string{"/root/.cache/vramguard/ollama/0.24.0/ollama", "runner", "--ollama-engine", "--port", "40124"}, vramguard.RoleOllamaDiscovery},
		{"v0.34.4 runner", []string{"/usr/lib/ollama/llama-server", "--model", "/root/.ollama/models/blobs/sha256-" + attrHexA, "--port", "40125", "--host", "127.0.0.1", "--ctx-size", "4096"}, vramguard.RoleOllamaRunner},
		{"v0.34.4 list-devices", []string{"/usr/lib/ollama/llama-server", "--list-devices"}, vramguard.RoleOllamaDiscovery},
		{"v0.34.4 discovery start", []string{"/usr/lib/ollama/llama-server", "--port", "40126"}, vramguard.RoleOllamaDiscovery},
		{"v0.34.4 gpu-discover", []string{"/usr/local/bin/ollama", "gpu-discover", "--lib-dir", "/usr/local/lib/ollama"}, vramguard.RoleOllamaDiscovery},
		{"user llama-server -m", []string{"llama-server", "-m", "model.gguf"}, vramguard.RoleOther},
		{"user llama-server on an Ollama blob", []string{"llama-server", "-m", "/home/ada/.ollama/models/blobs/sha256-" + attrHexA}, vramguard.RoleOllamaRunner},
		{"old runner binary", []string{"/tmp/ollama1180235561/runners/cuda_v12/ollama_llama_server", "--model", "/m"}, vramguard.RoleOllamaRunner},
		{"old runner binary, nvidia-smi", []string{"/tmp/ollama1180235561/runners/cuda_v12/ollama_llama_server"}, vramguard.RoleOllamaRunner},
		{"deleted binary", []string{"/usr/bin/ollama (deleted)", "runner"}, vramguard.RoleOllamaRunner},
		{"argv rewritten into one string", []string{"/usr/local/bin/ollama runner --model /m --port 1"}, vramguard.RoleOllamaRunner},
		{"nvidia-smi: ollama", []string{"/usr/local/bin/ollama"}, vramguard.RoleUnknown},
		{"nvidia-smi: Ollama's llama-server", []string{"/usr/lib/ollama/llama-server"}, vramguard.RoleUnknown},
		{"nvidia-smi: a llama-server elsewhere", []string{"/usr/local/bin/llama-server"}, vramguard.RoleOther},
		{"cli run", []string{"ollama", "run", "llama3"}, vramguard.RoleOther},
		{"cli version", []string{"ollama", "--version"}, vramguard.RoleOther},
		{"python", []string{"/home/ada/ComfyUI/venv/bin/python", "main.py", "--listen"}, vramguard.RoleOther},
		{"words in one string", []string{"python3 ollama runner"}, vramguard.RoleOther},
		{"xorg", []string{"/usr/lib/xorg/Xorg"}, vramguard.RoleOther},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClassifyCommand(tt.args); got != tt.want {
				t.Errorf("ClassifyCommand(%q) = %v, want %v", tt.args, got, tt.want)
			}
		})
	}
}

// writeProc writes a fake procfs: one cmdline per pid (arguments separated
// by spaces here, NUL in the file) and, when ns is not empty, self/ns/pid.
func writeProc(t testing.TB, cmdlines map[uint32]string, ns string) string {
	t.Helper()
	root := t.TempDir()
	for pid, cmd := range cmdlines {
		dir := filepath.Join(root, strconv.FormatUint(uint64(pid), 10))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		b := []byte(strings.ReplaceAll(cmd, " ", "\x00") + "\x00")
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if ns != "" {
		dir := filepath.Join(root, "self", "ns")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(ns, filepath.Join(dir, "pid")); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestAttrProcFS(t *testing.T) {
	cmds := map[uint32]string{10: "/usr/bin/ollama runner --port 1", 11: ""}
	host := newProcFS(writeProc(t, cmds, initPIDNamespace))
	if got := host.args(10); !reflect.DeepEqual(got, []string{"/usr/bin/ollama", "runner", "--port", "1"}) {
		t.Errorf("args(10) = %q", got)
	}
	if got := host.args(11); got != nil {
		t.Errorf("args of an empty cmdline = %q, want nil", got)
	}
	if got := host.args(12); got != nil {
		t.Errorf("args of a missing pid = %q, want nil", got)
	}
	var p vramguard.GPUProcess
	p.PID = 12
	host.describe(&p, "/usr/bin/python3")
	if p.Command != "/usr/bin/python3" || p.Role != vramguard.RoleOther {
		t.Errorf("fallback name: %+v", p)
	}

	// In a child PID namespace host PIDs name other processes: resolve none.
	container := newProcFS(writeProc(t, cmds, "pid:[4026532511]"))
	if got := container.args(10); got != nil {
		t.Errorf("args in a child namespace = %q, want nil", got)
	}
	// Without the link (a fake root) the namespace is taken as the host's.
	if got := newProcFS(writeProc(t, cmds, "")).args(10); len(got) != 4 {
		t.Errorf("args without ns link = %q", got)
	}
}

func TestAttrProcFSLongCmdline(t *testing.T) {
	long := "/usr/bin/ollama runner --model /m/blobs/sha256-" + attrHexA + " " + strings.Repeat("x", 3*cmdlineMax)
	fs := newProcFS(writeProc(t, map[uint32]string{5: long}, ""))
	args := fs.args(5)
	if n := len(strings.Join(args, "\x00")); n > cmdlineMax {
		t.Errorf("read %d bytes, want at most %d", n, cmdlineMax)
	}
	p := vramguard.GPUProcess{PID: 5}
	fs.describe(&p, "")
	if p.Role != vramguard.RoleOllamaRunner || p.Blob != "sha256:"+attrHexA {
		t.Errorf("truncated runner: %v, blob %q", p.Role, p.Blob)
	}
}

func TestAttrFindOrphans(t *testing.T) {
	runner := func(pid uint32, used uint64, known bool) vramguard.GPUProcess {
		return vramguard.GPUProcess{PID: pid, UsedBytes: used, UsedKnown: known, Command: "ollama runner", Role: vramguard.RoleOllamaRunner}
	}
	gone := func(p vramguard.GPUProcess) vramguard.GPUProcess { p.Orphaned = true; return p }
	snap := &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{
		{Index: 0, ProcessesKnown: true, Processes: []vramguard.GPUProcess{
			runner(100, 4<<30, true),
			runner(101, 0, true), // holds nothing
			runner(102, 0, false),
			gone(runner(104, 3<<30, true)), // its server was killed
			{PID: 5, UsedBytes: 9 << 30, UsedKnown: true, Role: vramguard.RoleOther},
			{PID: 6, UsedBytes: 1 << 30, UsedKnown: true, Role: vramguard.RoleOllamaServer},
			{PID: 7, UsedBytes: 1 << 30, UsedKnown: true, Role: vramguard.RoleUnknown},
			{PID: 8, UsedBytes: 1 << 30, UsedKnown: true, Role: vramguard.RoleOllamaDiscovery, Orphaned: true}, // never
		}},
		{Index: 1, ProcessesKnown: true, Processes: []vramguard.GPUProcess{
			runner(100, 2<<30, true), // the same runner split over two GPUs
			runner(103, 8<<30, true),
			gone(runner(104, 1<<30, true)),
		}},
	}}
	tests := []struct {
		name   string
		loaded int
		want   []vramguard.GPUProcess
	}{
		{"nothing listed: every runner", 0,
			[]vramguard.GPUProcess{runner(103, 8<<30, true), runner(100, 6<<30, true), gone(runner(104, 4<<30, true)), runner(102, 0, false)}},
		{"negative count", -1,
			[]vramguard.GPUProcess{runner(103, 8<<30, true), runner(100, 6<<30, true), gone(runner(104, 4<<30, true)), runner(102, 0, false)}},
		{"models listed: only runners whose server is gone", 1, []vramguard.GPUProcess{gone(runner(104, 4<<30, true))}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := FindOrphans(snap, tt.loaded); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("FindOrphans(%d) =\n%+v\nwant\n%+v", tt.loaded, got, tt.want)
			}
		})
	}
	if got := FindOrphans(nil, 0); got != nil {
		t.Errorf("FindOrphans(nil) = %+v", got)
	}
	alive := &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{Processes: []vramguard.GPUProcess{runner(100, 1, true)}}}}
	if got := FindOrphans(alive, 1); got != nil {
		t.Errorf("FindOrphans of a live runner with a model listed = %+v, want nil", got)
	}
}

// procEntry is one process of a fake procfs with stat files.
type procEntry struct {
	pid, ppid uint32
	state     byte
	comm      string
	args      []string
}

// writeProcTree writes root/<pid>/stat and root/<pid>/cmdline for each
// process, and root/self/ns/pid pointing at the host namespace.
func writeProcTree(t *testing.T, ps ...procEntry) string {
	t.Helper()
	root := t.TempDir()
	for _, p := range ps {
		dir := filepath.Join(root, strconv.FormatUint(uint64(p.pid), 10))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		state := p.state
		if state == 0 {
			state = 'S'
		}
		stat := fmt.Sprintf("%d (%s) %c %d %d %d 0 -1 4194560 0 0 0 0 1 1 0 0 20 0 1 0 100 0 0\n", p.pid, p.comm, state, p.ppid, p.pid, p.pid)
		var cmdline []byte
		for _, a := range p.args {
			cmdline = append(append(cmdline, a...), 0)
		}
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), cmdline, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ns := filepath.Join(root, "self", "ns")
	if err := os.MkdirAll(ns, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(initPIDNamespace, filepath.Join(ns, "pid")); err != nil {
		t.Fatal(err)
	}
	return root
}

// TestAttrDescribe: what the procfs readers fill in for each process a
// driver lists, for runners of both generations, discovery processes and
// runners whose server is gone.
func TestAttrDescribe(t *testing.T) {
	blobPath := func(hex string) string { return "/root/.ollama/models/blobs/sha256-" + hex }
	v17 := "/root/.cache/vramguard/ollama/0.17.4/ollama"
	root := writeProcTree(t,
		procEntry{pid: 1, comm: "systemd", args: []string{"/sbin/init"}},
		procEntry{pid: 100, ppid: 1, comm: "ollama", args: []string{"/usr/bin/ollama", "serve"}},
		procEntry{pid: 101, ppid: 100, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--model", blobPath(attrHexA), "--port", "40125"}},
		procEntry{pid: 102, ppid: 100, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--list-devices"}},
		procEntry{pid: 103, ppid: 1, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--model", blobPath(attrHexB), "--port", "40126"}},
		procEntry{pid: 200, ppid: 1, comm: "ollama", args: []string{v17, "serve"}},
		procEntry{pid: 201, ppid: 200, comm: "ollama", args: []string{v17, "runner", "--model", blobPath(attrHexB), "--port", "40123"}},
		procEntry{pid: 202, ppid: 200, comm: "ollama", args: []string{v17, "runner", "--ollama-engine", "--port", "40124"}},
		procEntry{pid: 203, ppid: 4000, comm: "ollama", args: []string{v17, "runner", "--model", blobPath(attrHexA), "--port", "40127"}},
		procEntry{pid: 300, ppid: 100, comm: "ollama", args: []string{"/usr/bin/ollama", "runner", "--model", "qwen3:latest", "--port", "40128"}},
		procEntry{pid: 400, ppid: 1, comm: "llama-server", args: []string{"llama-server", "-m", "model.gguf"}},
	)
	a, b := "sha256:"+attrHexA, "sha256:"+attrHexB
	tests := []struct {
		name     string
		pid      uint32
		fallback string // what nvidia-smi reports
		want     vramguard.GPUProcess
	}{
		{"v0.34.4 runner", 101, "", vramguard.GPUProcess{Role: vramguard.RoleOllamaRunner, Blob: a}},
		{"v0.34.4 discovery", 102, "", vramguard.GPUProcess{Role: vramguard.RoleOllamaDiscovery}},
		{"v0.34.4 runner of a killed server", 103, "", vramguard.GPUProcess{Role: vramguard.RoleOllamaRunner, Blob: b, Orphaned: true}},
		{"v0.17.4 runner", 201, "", vramguard.GPUProcess{Role: vramguard.RoleOllamaRunner, Blob: b}},
		{"v0.17.4 discovery", 202, "", vramguard.GPUProcess{Role: vramguard.RoleOllamaDiscovery}},
		{"runner whose parent vanished", 203, "", vramguard.GPUProcess{Role: vramguard.RoleOllamaRunner, Blob: a, Orphaned: true}},
		{"MLX runner names its model", 300, "", vramguard.GPUProcess{Role: vramguard.RoleOllamaRunner, Model: "qwen3:latest"}},
		{"user llama-server", 400, "", vramguard.GPUProcess{Role: vramguard.RoleOther}},
		{"server", 100, "", vramguard.GPUProcess{Role: vramguard.RoleOllamaServer}},
		{"invisible, nvidia-smi's name", 999, "/usr/lib/ollama/llama-server", vramguard.GPUProcess{Role: vramguard.RoleUnknown, Command: "/usr/lib/ollama/llama-server"}},
	}
	fs := newProcFS(root)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := vramguard.GPUProcess{PID: tt.pid, UsedBytes: 1 << 30, UsedKnown: true}
			fs.describe(&p, tt.fallback)
			want := tt.want
			want.PID, want.UsedBytes, want.UsedKnown = tt.pid, 1<<30, true
			if want.Command == "" {
				want.Command = strings.Join(fs.args(tt.pid), " ")
			}
			if p != want {
				t.Errorf("describe(%d) =\n%+v\nwant\n%+v", tt.pid, p, want)
			}
		})
	}

	// In a child PID namespace nothing is resolved, not even parents.
	off := procFS{root: root, off: true}
	p := vramguard.GPUProcess{PID: 103}
	off.describe(&p, "/usr/lib/ollama/llama-server")
	if p.Orphaned || p.Blob != "" || p.Role != vramguard.RoleUnknown {
		t.Errorf("describe in a child namespace = %+v", p)
	}
}

func TestAttrKillProcessRefuses(t *testing.T) {
	for _, pid := range []uint32{0, 1, uint32(os.Getpid()), 0xFFFFFFFF, 1 << 31} {
		err := KillProcess(pid)
		if !errors.Is(err, vramguard.KindInvalidInput) {
			t.Errorf("KillProcess(%d) = %v, want KindInvalidInput", pid, err)
		}
	}
}

func TestAttrKillProcess(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep binary")
	}
	cmd := exec.Command(sleep, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := uint32(cmd.Process.Pid)
	if err := KillProcess(pid); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Fatalf("Wait = %v, want killed", err)
	}
	if err := KillProcess(pid); !errors.Is(err, vramguard.KindNotFound) {
		t.Errorf("KillProcess of a reaped pid = %v, want KindNotFound", err)
	}
}
