package gpu_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
)

// procTree writes a fake procfs: pid -> (ppid, comm, argv).
func procTree(t *testing.T, procs map[int]struct {
	ppid int
	comm string
	args []string
}) string {
	t.Helper()
	root := t.TempDir()
	for pid, p := range procs {
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		stat := fmt.Sprintf("%d (%s) S %d %d %d 0 -1 4194560\n", pid, p.comm, p.ppid, pid, pid)
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "cmdline"), []byte(strings.Join(p.args, "\x00")+"\x00"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// ProcRunners finds the runners of a live server and an orphan, with no
// GPU; a missing procfs is KindUnavailable.
func TestProcRunners(t *testing.T) {
	hex := strings.Repeat("ab", 32)
	blob := "/root/.ollama/models/blobs/sha256-" + hex
	root := procTree(t, map[int]struct {
		ppid int
		comm string
		args []string
	}{
		1:    {0, "systemd", []string{"/sbin/init"}},
		100:  {1, "ollama", []string{"/usr/bin/ollama", "serve"}},
		4001: {100, "ollama", []string{"/usr/bin/ollama", "runner", "--model", blob, "--port", "40001"}},
		4002: {1, "llama-server", []string{"/usr/lib/ollama/llama-server", "--model", blob}},
		5000: {1, "bash", []string{"bash"}},
	})
	rs, err := gpu.ProcRunners(root)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].PID != 4001 || rs[1].PID != 4002 {
		t.Fatalf("runners %+v, want 4001 and 4002", rs)
	}
	for i, orphan := range []bool{false, true} {
		r := rs[i]
		if r.Role != vramguard.RoleOllamaRunner || r.UsedKnown || r.Blob != "sha256:"+hex || r.Orphaned != orphan || !strings.Contains(r.Command, "--model") {
			t.Errorf("runner %+v: want a runner of the blob, memory not known, orphaned %v", r, orphan)
		}
	}
	if _, err := gpu.ProcRunners(filepath.Join(t.TempDir(), "absent")); !errors.Is(err, vramguard.KindUnavailable) {
		t.Errorf("absent procfs: %v, want KindUnavailable", err)
	}
}
