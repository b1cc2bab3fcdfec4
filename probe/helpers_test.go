package probe_test

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/probe"
	"github.com/vramguard/vramguard/vramguardtest"
)

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

// The weights blobs of the simulator's models.
const (
	hexTiny  = "6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"
	hexSmall = "e8ad13eff07a78d89926e9e8b882317d082ef5bf9768ad7b50fcdbbcd63748de"
)

// fakeReader reports one device of 16 GiB with the given processes.
type fakeReader []vramguard.GPUProcess

func (f fakeReader) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	d := vramguard.DeviceMemory{Index: 0, Name: "Fake GPU", Total: 16 * gib, ProcessesKnown: true, Processes: []vramguard.GPUProcess(f)}
	for _, p := range f {
		d.Used += p.UsedBytes
	}
	d.Free = d.Total - d.Used
	return &vramguard.VRAMSnapshot{Source: "fake", Taken: time.Now(), Devices: []vramguard.DeviceMemory{d}}, nil
}

// llamaServer is a v0.34.4 runner of the weights hex, as the NVML reader
// describes it from /proc.
func llamaServer(pid uint32, used uint64, hex string) vramguard.GPUProcess {
	return vramguard.GPUProcess{PID: pid, UsedBytes: used, UsedKnown: true,
		Command: "/usr/lib/ollama/llama-server --model /root/.ollama/models/blobs/sha256-" + hex + " --port 40125",
		Role:    vramguard.RoleOllamaRunner, Blob: "sha256:" + hex}
}

var discovery = vramguard.GPUProcess{PID: 5150, UsedBytes: 300 << 20, UsedKnown: true, Command: "/usr/lib/ollama/llama-server --list-devices", Role: vramguard.RoleOllamaDiscovery}

// gpuKind is how a test case gets its GPU reader.
type gpuKind int

const (
	gpuSim   gpuKind = iota // vramguardtest.GPU over the test's simulator
	gpuNone                 // no GPU reader
	gpuNamed                // llama-server runners of tiny and small, and a discovery probe
)

func (g gpuKind) reader(s *vramguardtest.Server) vramguard.VRAMReader {
	switch g {
	case gpuSim:
		return &vramguardtest.GPU{Server: s}
	case gpuNamed:
		return fakeReader{llamaServer(4001, 2*gib, hexTiny), llamaServer(4002, 3*gib, hexSmall), discovery}
	}
	return nil
}

// fakeProc is one process of a fake procfs tree.
type fakeProc struct {
	pid, ppid int
	state     byte // 'S' when zero
	comm      string
	args      []string
	listen    int // a TCP port it listens on (atSim: the simulator's); 0 for none
}

// atSim is fakeProc.listen for the port of the test's simulator.
const atSim = -1

// procTree writes a procfs tree of ps (each pid's stat and cmdline, and
// for one that listens the socket in net/tcp and its fd) and returns its
// root. sim is the port of the test's simulator.
func procTree(t *testing.T, sim int, ps ...fakeProc) string {
	t.Helper()
	root := t.TempDir()
	table := "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	for i, p := range ps {
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
		if p.listen == 0 {
			continue
		}
		port := p.listen
		if port == atSim {
			port = sim
		}
		inode := 7000 + p.pid
		table += fmt.Sprintf("%4d: 0100007F:%04X 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 %d 1 0000000000000000 100 0 0 10 0\n", i, port, inode)
		fd := filepath.Join(dir, "fd")
		if err := os.Mkdir(fd, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(fmt.Sprintf("socket:[%d]", inode), filepath.Join(fd, "3")); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(root, "net"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "net", "tcp"), []byte(table), 0o444); err != nil {
		t.Fatal(err)
	}
	return root
}

// simPort is the TCP port s listens on.
func simPort(t *testing.T, s *vramguardtest.Server) int {
	t.Helper()
	port, err := strconv.Atoi(s.URL().Port())
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// otherPort is a port that is not port: Ollama's default, unless that is
// port.
func otherPort(port int) int {
	if port == 11434 {
		return 11435
	}
	return 11434
}

// blobPath is where Ollama keeps the weights blob hex.
func blobPath(hex string) string { return "/root/.ollama/models/blobs/sha256-" + hex }

var (
	procInit = fakeProc{pid: 1, comm: "systemd", args: []string{"/sbin/init"}}
	// procServer: the `ollama serve` that listens at the simulator's port.
	procServer = fakeProc{pid: 100, ppid: 1, comm: "ollama", args: []string{"/usr/local/bin/ollama", "serve"}, listen: atSim}
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

// newHandler returns the Handler of s with the case's GPU reader and
// procfs tree, as vramwatch -listen builds it, closed at the end of the
// test.
func newHandler(t *testing.T, s *vramguardtest.Server, g gpuKind, procRoot string) *probe.Handler {
	t.Helper()
	client, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), KeepModelsOnClose: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := client.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	h, err := probe.New(probe.Config{Client: client, VRAM: g.reader(s), ProcRoot: procRoot})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return h
}

// endpoints serves newHandler's Handler over HTTP.
func endpoints(t *testing.T, s *vramguardtest.Server, g gpuKind, procRoot string) *httptest.Server {
	t.Helper()
	hs := httptest.NewServer(newHandler(t, s, g, procRoot))
	t.Cleanup(hs.Close)
	return hs
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }
