package procs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// fakeProc is one process of a fake procfs tree.
type fakeProc struct {
	pid, ppid int
	state     byte
	comm      string
	args      []string
}

// writeTree writes a fake procfs under a temporary directory: for each
// process root/<pid>/stat and root/<pid>/cmdline, plus the entries a real
// /proc has that are not processes.
func writeTree(t testing.TB, ps ...fakeProc) string {
	t.Helper()
	root := t.TempDir()
	for _, p := range ps {
		writeProcess(t, root, p)
	}
	for _, name := range []string{"self", "thread-self", "sys", "0123", "acpi"} {
		if err := os.MkdirAll(filepath.Join(root, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"uptime", "meminfo"} {
		if err := os.WriteFile(filepath.Join(root, name), []byte("1\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func writeProcess(t testing.TB, root string, p fakeProc) {
	t.Helper()
	dir := filepath.Join(root, strconv.Itoa(p.pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	state := p.state
	if state == 0 {
		state = 'S'
	}
	// The real line goes on for some 50 fields.
	stat := fmt.Sprintf("%d (%s) %c %d %d %d 0 -1 4194560 2411 0 0 0 12 3 0 0 20 0 9 0 1234567 1234567890 5678 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0\n",
		p.pid, p.comm, state, p.ppid, p.pid, p.pid)
	if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
		t.Fatal(err)
	}
	var cmdline []byte
	for _, a := range p.args {
		cmdline = append(cmdline, a...)
		cmdline = append(cmdline, 0)
	}
	if err := os.WriteFile(filepath.Join(dir, "cmdline"), cmdline, 0o644); err != nil {
		t.Fatal(err)
	}
}

func blobPath(hex string) string { return "/root/.ollama/models/blobs/sha256-" + hex }

func TestParseStat(t *testing.T) {
	tests := []struct {
		line string
		want Stat
		err  bool
	}{
		{"4242 (llama-server) S 4100 4242 4242 0 -1 4194560", Stat{PID: 4242, PPID: 4100, State: 'S', Comm: "llama-server"}, false},
		{"1 (systemd) S 0 1 1 0", Stat{PID: 1, PPID: 0, State: 'S', Comm: "systemd"}, false},
		{"77 (a b) c) d) R 1 77", Stat{PID: 77, PPID: 1, State: 'R', Comm: "a b) c) d"}, false},
		{"78 (() Z 5 78", Stat{PID: 78, PPID: 5, State: 'Z', Comm: "("}, false},
		{"79 () S 2", Stat{PID: 79, PPID: 2, State: 'S', Comm: ""}, false},
		{"80 (x\ny) S 2\n", Stat{PID: 80, PPID: 2, State: 'S', Comm: "x\ny"}, false},
		{"", Stat{}, true},
		{"4242 llama-server S 1", Stat{}, true},
		{"(ollama) S 1", Stat{}, true},
		{"x (ollama) S 1", Stat{}, true},
		{"-3 (ollama) S 1", Stat{}, true},
		{"5 (ollama) S", Stat{}, true},
		{"5 (ollama) S -1", Stat{}, true},
		{"5 (ollama) SS 1", Stat{}, true},
		{"5 (ollama) S x", Stat{}, true},
		{"5 (ollama", Stat{}, true},
	}
	for _, tt := range tests {
		got, err := ParseStat([]byte(tt.line))
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("ParseStat(%q) = %+v, %v; want %+v, error %v", tt.line, got, err, tt.want, tt.err)
		}
	}
}

func TestReadProcess(t *testing.T) {
	root := writeTree(t,
		fakeProc{pid: 100, ppid: 1, comm: "ollama", args: []string{"/usr/bin/ollama", "serve"}},
		fakeProc{pid: 101, ppid: 100, comm: "ollama", args: []string{"/usr/bin/ollama", "runner", "--model", blobPath(hexA), "--port", "40001"}},
		fakeProc{pid: 102, ppid: 100, state: 'Z', comm: "ollama"},
		fakeProc{pid: 103, ppid: 1, comm: "x y) (z", args: []string{"weird"}},
	)
	p, err := Read(root, 101)
	if err != nil {
		t.Fatal(err)
	}
	want := Process{
		Stat: Stat{PID: 101, PPID: 100, State: 'S', Comm: "ollama"},
		Args: []string{"/usr/bin/ollama", "runner", "--model", blobPath(hexA), "--port", "40001"},
		Info: Info{Role: RoleRunner, Generation: GenOllamaRunner, ModelPath: blobPath(hexA), Blob: "sha256:" + hexA},
	}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("Read(101) =\n%+v\nwant\n%+v", p, want)
	}
	if p, err := Read(root, 102); err != nil || p.Args != nil || p.State != 'Z' || p.Role != RoleUnknown {
		t.Errorf("zombie: %+v, %v", p, err)
	}
	if st, err := ReadStat(root, 103); err != nil || st.Comm != "x y) (z" || st.PPID != 1 {
		t.Errorf("comm with spaces and parentheses: %+v, %v", st, err)
	}
	if _, err := Read(root, 999); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Read of a missing pid: %v, want fs.ErrNotExist", err)
	}
	if _, err := ReadArgs(root, 999); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadArgs of a missing pid: %v, want fs.ErrNotExist", err)
	}
}

func TestReadArgsBounded(t *testing.T) {
	long := append([]string{"/usr/bin/ollama", "runner", "--model", blobPath(hexA)}, strings.Repeat("x", 3*MaxArgsBytes))
	root := writeTree(t, fakeProc{pid: 5, ppid: 1, comm: "ollama", args: long})
	args, err := ReadArgs(root, 5)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Join(args, "\x00")); n > MaxArgsBytes {
		t.Errorf("read %d bytes, want at most %d", n, MaxArgsBytes)
	}
	if info := Classify(args); info.Role != RoleRunner || info.Blob != "sha256:"+hexA {
		t.Errorf("truncated runner: %+v", info)
	}
}

func TestRunners(t *testing.T) {
	runnerArgs := func(exe, hex string, port int) []string {
		return []string{exe, "--model", blobPath(hex), "--port", strconv.Itoa(port), "--host", "127.0.0.1", "--ctx-size", "4096"}
	}
	oldRunner := func(hex string, port int) []string {
		return []string{"/root/.cache/vramguard/ollama/0.17.4/ollama", "runner", "--model", "/tmp/x/models/blobs/sha256-" + hex, "--port", strconv.Itoa(port)}
	}
	root := writeTree(t,
		fakeProc{pid: 1, ppid: 0, comm: "systemd", args: []string{"/sbin/init"}},
		fakeProc{pid: 900, ppid: 1, comm: "containerd-shim", args: []string{"/usr/bin/containerd-shim-runc-v2"}},
		// A live v0.34.4 server with a runner and a discovery probe.
		fakeProc{pid: 100, ppid: 1, comm: "ollama", args: []string{"/usr/bin/ollama", "serve"}},
		fakeProc{pid: 101, ppid: 100, comm: "llama-server", args: runnerArgs("/usr/lib/ollama/llama-server", hexA, 40125)},
		fakeProc{pid: 102, ppid: 100, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--list-devices"}},
		fakeProc{pid: 103, ppid: 100, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--port", "40126"}},
		// A runner whose server was killed: adopted by init.
		fakeProc{pid: 200, ppid: 1, comm: "llama-server", args: runnerArgs("/usr/lib/ollama/llama-server", hexB, 40127)},
		// A runner adopted by a subreaper.
		fakeProc{pid: 201, ppid: 900, comm: "ollama", args: oldRunner(hexA, 40128)},
		// A v0.17.4 runner of a live server, and one of a zombie server.
		fakeProc{pid: 300, ppid: 1, comm: "ollama", args: []string{"/root/.cache/vramguard/ollama/0.17.4/ollama", "serve"}},
		fakeProc{pid: 301, ppid: 300, comm: "ollama", args: oldRunner(hexB, 40129)},
		fakeProc{pid: 302, ppid: 1, state: 'Z', comm: "ollama"},
		fakeProc{pid: 303, ppid: 302, comm: "ollama", args: oldRunner(hexA, 40130)},
		// A runner whose parent is outside the namespace (PPID 0): unknown.
		fakeProc{pid: 400, ppid: 0, comm: "ollama", args: oldRunner(hexA, 40131)},
		// A runner whose parent vanished between the listing and the check.
		fakeProc{pid: 401, ppid: 4000, comm: "ollama", args: oldRunner(hexA, 40132)},
		// A runner whose parent's command line is empty (unreadable): unknown.
		fakeProc{pid: 500, ppid: 1, comm: "ollama"},
		fakeProc{pid: 501, ppid: 500, comm: "ollama", args: oldRunner(hexB, 40133)},
		// Not runners: a user's llama-server, the CLI, a python process.
		fakeProc{pid: 600, ppid: 1, comm: "llama-server", args: []string{"llama-server", "-m", "model.gguf"}},
		fakeProc{pid: 601, ppid: 1, comm: "ollama", args: []string{"ollama", "run", "tiny"}},
		fakeProc{pid: 602, ppid: 1, comm: "python3", args: []string{"python3", "/usr/lib/ollama/llama-server", "--model", blobPath(hexA)}},
		// Comm with spaces and parentheses, argv of a runner: comm decides
		// that its command line is not even read.
		fakeProc{pid: 603, ppid: 100, comm: "a (b) c", args: runnerArgs("/usr/lib/ollama/llama-server", hexA, 1)},
	)
	// A process directory without files: vanished after the listing.
	if err := os.MkdirAll(filepath.Join(root, "700"), 0o755); err != nil {
		t.Fatal(err)
	}

	rs, err := Runners(root)
	if err != nil {
		t.Fatal(err)
	}
	type row struct {
		pid, server int
		orphaned    bool
		blob        string
		gen         Generation
	}
	var got []row
	for _, r := range rs {
		if r.Role != RoleRunner || len(r.Args) == 0 || r.Comm == "" {
			t.Errorf("runner %d not filled in: %+v", r.PID, r)
		}
		got = append(got, row{r.PID, r.ServerPID, r.Orphaned, r.Blob, r.Generation})
	}
	a, b := "sha256:"+hexA, "sha256:"+hexB
	want := []row{
		{101, 100, false, a, GenLlamaServer},
		{200, 0, true, b, GenLlamaServer},
		{201, 0, true, a, GenOllamaRunner},
		{301, 300, false, b, GenOllamaRunner},
		{303, 0, true, a, GenOllamaRunner},
		{400, 0, false, a, GenOllamaRunner},
		{401, 0, true, a, GenOllamaRunner},
		{501, 0, false, b, GenOllamaRunner},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Runners =\n%+v\nwant\n%+v", got, want)
	}

	forA, err := RunnersFor(root, "/elsewhere/blobs/sha256-"+hexA)
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, r := range forA {
		pids = append(pids, r.PID)
	}
	if !reflect.DeepEqual(pids, []int{101, 201, 303, 400, 401}) {
		t.Errorf("RunnersFor(blob A) = %v", pids)
	}
	if rs, err := RunnersFor(root, ""); rs != nil || err != nil {
		t.Errorf("RunnersFor(\"\") = %v, %v; want nil", rs, err)
	}

	for _, tt := range []struct {
		ppid          int
		server, known bool
	}{{100, true, true}, {1, false, true}, {302, false, true}, {4000, false, true}, {0, false, false}, {500, false, false}, {601, false, true}} {
		if s, k := ParentIsServer(root, tt.ppid); s != tt.server || k != tt.known {
			t.Errorf("ParentIsServer(%d) = %v, %v; want %v, %v", tt.ppid, s, k, tt.server, tt.known)
		}
	}
}

func TestRunnersErrors(t *testing.T) {
	if _, err := Runners(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("Runners of a missing root: no error")
	}
	empty := t.TempDir()
	if rs, err := Runners(empty); err != nil || len(rs) != 0 {
		t.Errorf("Runners of an empty root = %v, %v", rs, err)
	}
}

// TestRunnersRealProc runs on this machine's /proc: it must not fail, and
// the test process itself is no runner.
func TestRunnersRealProc(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no procfs")
	}
	rs, err := Runners("")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rs {
		if r.PID == os.Getpid() {
			t.Errorf("the test process is listed as a runner: %+v", r)
		}
	}
	p, err := Read("", os.Getpid())
	if err != nil || p.PID != os.Getpid() || p.PPID != os.Getppid() || len(p.Args) == 0 {
		t.Errorf("Read(self) = %+v, %v", p, err)
	}
}

func BenchmarkRunners(b *testing.B) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		b.Skip("no procfs")
	}
	d, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	n := 0
	for _, e := range d {
		if isPID(e.Name()) {
			n++
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Runners(""); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(n), "procs")
}

// BenchmarkRunnersFake measures a pass over a fake tree of 300 processes,
// 10 of them Ollama's.
func BenchmarkRunnersFake(b *testing.B) {
	var ps []fakeProc
	ps = append(ps, fakeProc{pid: 2, ppid: 1, comm: "ollama", args: []string{"/usr/bin/ollama", "serve"}})
	for i := 3; i < 300; i++ {
		p := fakeProc{pid: i, ppid: 1, comm: "bash", args: []string{"/bin/bash", "-l"}}
		if i%30 == 0 {
			p = fakeProc{pid: i, ppid: 2, comm: "llama-server", args: []string{"/usr/lib/ollama/llama-server", "--model", blobPath(hexA), "--port", "1"}}
		}
		ps = append(ps, p)
	}
	root := writeTree(b, ps...)
	b.ReportAllocs()
	for b.Loop() {
		rs, err := Runners(root)
		if err != nil || len(rs) != 9 {
			b.Fatalf("Runners = %d, %v", len(rs), err)
		}
	}
}
