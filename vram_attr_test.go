package vramguard

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

func TestAttrClassifyCommand(t *testing.T) {
	tests := []struct {
		args []string
		want ProcessRole
	}{
		{nil, RoleUnknown},
		{[]string{""}, RoleUnknown},
		{[]string{"/usr/local/bin/ollama", "serve"}, RoleOllamaServer},
		{[]string{"ollama", "--verbose", "serve"}, RoleOllamaServer},
		{[]string{"/usr/local/bin/ollama", "runner", "--model", "/root/.ollama/models/blobs/sha256-ab", "--port", "40123"}, RoleOllamaRunner},
		{[]string{"/usr/local/bin/ollama", "runner", "--ollama-engine", "--port", "40123"}, RoleOllamaRunner},
		{[]string{"/tmp/ollama1180235561/runners/cuda_v12/ollama_llama_server", "--model", "/m"}, RoleOllamaRunner},
		{[]string{"/tmp/ollama1180235561/runners/cuda_v12/ollama_llama_server"}, RoleOllamaRunner},
		{[]string{`C:\Users\ada\AppData\Local\Programs\Ollama\ollama.exe`, "serve"}, RoleOllamaServer},
		{[]string{"/usr/bin/ollama (deleted)", "runner"}, RoleOllamaRunner},
		{[]string{"/usr/local/bin/ollama runner --model /m --port 1"}, RoleOllamaRunner}, // argv rewritten into one string
		{[]string{"/usr/local/bin/ollama"}, RoleUnknown},                                 // nvidia-smi's process_name
		{[]string{"ollama", "run", "llama3"}, RoleOther},
		{[]string{"ollama", "--version"}, RoleOther},
		{[]string{"/home/ada/ComfyUI/venv/bin/python", "main.py", "--listen"}, RoleOther},
		{[]string{"python3 ollama runner"}, RoleOther},
		{[]string{"/usr/lib/xorg/Xorg"}, RoleOther},
	}
	for _, tt := range tests {
		if got := ClassifyCommand(tt.args); got != tt.want {
			t.Errorf("ClassifyCommand(%q) = %v, want %v", tt.args, got, tt.want)
		}
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
	host := newVRAMProcFS(writeProc(t, cmds, vramInitPIDNamespace))
	if got := host.args(10); !reflect.DeepEqual(got, []string{"/usr/bin/ollama", "runner", "--port", "1"}) {
		t.Errorf("args(10) = %q", got)
	}
	if got := host.args(11); got != nil {
		t.Errorf("args of an empty cmdline = %q, want nil", got)
	}
	if got := host.args(12); got != nil {
		t.Errorf("args of a missing pid = %q, want nil", got)
	}
	var p GPUProcess
	p.PID = 12
	host.describe(&p, "/usr/bin/python3")
	if p.Command != "/usr/bin/python3" || p.Role != RoleOther {
		t.Errorf("fallback name: %+v", p)
	}

	// In a child PID namespace host PIDs name other processes: resolve none.
	container := newVRAMProcFS(writeProc(t, cmds, "pid:[4026532511]"))
	if got := container.args(10); got != nil {
		t.Errorf("args in a child namespace = %q, want nil", got)
	}
	// Without the link (a fake root) the namespace is taken as the host's.
	if got := newVRAMProcFS(writeProc(t, cmds, "")).args(10); len(got) != 4 {
		t.Errorf("args without ns link = %q", got)
	}
}

func TestAttrProcFSLongCmdline(t *testing.T) {
	long := "/usr/bin/ollama runner " + strings.Repeat("x", 3*vramCmdlineMax)
	p := newVRAMProcFS(writeProc(t, map[uint32]string{5: long}, ""))
	args := p.args(5)
	if n := len(strings.Join(args, "\x00")); n > vramCmdlineMax {
		t.Errorf("read %d bytes, want at most %d", n, vramCmdlineMax)
	}
	if ClassifyCommand(args) != RoleOllamaRunner {
		t.Errorf("truncated runner not classified: %q", args[:2])
	}
}

func TestAttrFindOrphans(t *testing.T) {
	runner := func(pid uint32, used uint64, known bool) GPUProcess {
		return GPUProcess{PID: pid, UsedBytes: used, UsedKnown: known, Command: "ollama runner", Role: RoleOllamaRunner}
	}
	snap := &VRAMSnapshot{Devices: []DeviceMemory{
		{Index: 0, ProcessesKnown: true, Processes: []GPUProcess{
			runner(100, 4<<30, true),
			runner(101, 0, true), // holds nothing
			runner(102, 0, false),
			{PID: 5, UsedBytes: 9 << 30, UsedKnown: true, Role: RoleOther},
			{PID: 6, UsedBytes: 1 << 30, UsedKnown: true, Role: RoleOllamaServer},
			{PID: 7, UsedBytes: 1 << 30, UsedKnown: true, Role: RoleUnknown},
		}},
		{Index: 1, ProcessesKnown: true, Processes: []GPUProcess{
			runner(100, 2<<30, true), // the same runner split over two GPUs
			runner(103, 8<<30, true),
		}},
	}}
	got := FindOrphans(snap, 0)
	want := []GPUProcess{runner(103, 8<<30, true), runner(100, 6<<30, true), runner(102, 0, false)}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("FindOrphans(0) =\n%+v\nwant\n%+v", got, want)
	}
	if got := FindOrphans(snap, 1); got != nil {
		t.Errorf("FindOrphans(1) = %+v, want nil", got)
	}
	if got := FindOrphans(nil, 0); got != nil {
		t.Errorf("FindOrphans(nil) = %+v", got)
	}
}

func TestAttrKillProcessRefuses(t *testing.T) {
	for _, pid := range []uint32{0, 1, uint32(os.Getpid()), 0xFFFFFFFF, 1 << 31} {
		err := KillProcess(pid)
		if !errors.Is(err, KindInvalidInput) {
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
	if err := KillProcess(pid); !errors.Is(err, KindNotFound) {
		t.Errorf("KillProcess of a reaped pid = %v, want KindNotFound", err)
	}
}

func TestAttrFormatBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1 << 20: "1.0 MiB", 5 << 29: "2.5 GiB"} {
		if got := vramFormatBytes(n); got != want {
			t.Errorf("vramFormatBytes(%d) = %q, want %q", n, got, want)
		}
	}
}
