//go:build linux

package procs

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// The test binary plays Ollama for TestOrphanAfterServerKill: run through a
// link named ollama with PROCS_TEST_ROLE=serve it starts a "runner" (itself
// again, through a link at lib/ollama/llama-server), prints the runner's
// PID and waits; as the runner it waits. Neither outlives helperLife.
const helperLife = 30 * time.Second

func TestMain(m *testing.M) {
	switch os.Getenv("PROCS_TEST_ROLE") {
	case "serve":
		cmd := exec.Command(os.Getenv("PROCS_TEST_RUNNER"), "--model", os.Getenv("PROCS_TEST_MODEL"), "--port", "40125", "--host", "127.0.0.1")
		cmd.Env = append(os.Environ(), "PROCS_TEST_ROLE=runner")
		if err := cmd.Start(); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(cmd.Process.Pid)
		time.Sleep(helperLife)
		os.Exit(0)
	case "runner":
		time.Sleep(helperLife)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestOrphanAfterServerKill reproduces, on this machine's /proc, what
// Ollama v0.34.4 does after a kill -9 of `ollama serve`: its llama-server
// runner keeps running, adopted by init or a subreaper, and is then
// reported as orphaned.
func TestOrphanAfterServerKill(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no procfs")
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	server := filepath.Join(dir, "bin", "ollama")
	runner := filepath.Join(dir, "lib", "ollama", "llama-server")
	for _, link := range []string{server, runner} {
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(self, link); err != nil {
			t.Fatal(err)
		}
	}
	// A blob of its own, so that concurrent runs of this test do not see
	// each other's runners.
	var nonce [32]byte
	if _, err := rand.Read(nonce[:]); err != nil {
		t.Fatal(err)
	}
	hex := fmt.Sprintf("%x", nonce)
	model := "/root/.ollama/models/blobs/sha256-" + hex

	cmd := exec.Command(server, "serve")
	cmd.Env = append(os.Environ(), "PROCS_TEST_ROLE=serve", "PROCS_TEST_RUNNER="+runner, "PROCS_TEST_MODEL="+model)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serverPID := cmd.Process.Pid
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	runnerPID, err := strconv.Atoi(line[:len(line)-1])
	if err != nil {
		t.Fatalf("server said %q", line)
	}
	t.Cleanup(func() { _ = syscall.Kill(runnerPID, syscall.SIGKILL) })

	find := func() (Runner, bool) {
		rs, err := Runners("")
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if r.PID == runnerPID {
				return r, true
			}
		}
		return Runner{}, false
	}
	// The runner's exec may not have happened yet: wait for its argv.
	var r Runner
	var ok bool
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if r, ok = find(); ok || time.Now().After(deadline) {
			break
		}
	}
	if !ok {
		t.Fatalf("runner %d not listed", runnerPID)
	}
	if r.ServerPID != serverPID || r.Orphaned || r.Blob != "sha256:"+hex || r.Generation != GenLlamaServer || r.Comm != "llama-server" {
		t.Fatalf("runner of a live server: %+v, want server %d, not orphaned", r, serverPID)
	}

	// kill -9 the server: the runner survives, adopted.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait() // the kernel reparents the runner when the server exits
	r, ok = find()
	if !ok {
		t.Fatalf("runner %d gone with its server", runnerPID)
	}
	if !r.Orphaned || r.ServerPID != 0 || r.PPID == serverPID {
		t.Errorf("runner after kill -9 of its server: %+v, want orphaned", r)
	}
	if server, known := ParentIsServer("", r.PPID); server || !known {
		t.Errorf("ParentIsServer(%d) = %v, %v; want false, true", r.PPID, server, known)
	}
	if rs, err := RunnersFor("", "sha256:"+hex); err != nil || len(rs) != 1 || rs[0].PID != runnerPID {
		t.Errorf("RunnersFor = %+v, %v", rs, err)
	}
}
