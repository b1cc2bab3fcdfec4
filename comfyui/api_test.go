package comfyui_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
)

// TestInvalidGraph: a graph ComfyUI refuses is KindInvalidInput with its
// error type and node_errors; an empty one is refused before sending.
func TestInvalidGraph(t *testing.T) {
	p := newPair(t, comfyuitest.Config{})
	c := p.client(t, nil)
	tests := []struct {
		name     string
		wf       comfyui.Workflow
		typ      string
		nodeErrs bool
	}{
		{"unknown checkpoint", workflow(2, comfyui.Workflow{"4": {ClassType: "CheckpointLoaderSimple", Inputs: map[string]any{"ckpt_name": "missing.safetensors"}}}), "prompt_outputs_failed_validation", true},
		{"unknown class", comfyui.Workflow{"1": {ClassType: "NoSuchNode", Inputs: map[string]any{}}}, "invalid_prompt", false},
		{"no output", comfyui.Workflow{"4": {ClassType: "CheckpointLoaderSimple", Inputs: map[string]any{"ckpt_name": ckpt}}}, "prompt_no_outputs", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.Submit(t.Context(), tt.wf)
			var pe *comfyui.PromptError
			if !errors.As(err, &pe) || vramguard.KindOf(err) != vramguard.KindInvalidInput || pe.Type != tt.typ || (len(pe.NodeErrors) > 0) != tt.nodeErrs {
				t.Errorf("Submit = %v (%+v); want KindInvalidInput of type %s, node errors %v", err, pe, tt.typ, tt.nodeErrs)
			}
			if tt.nodeErrs && !strings.Contains(err.Error(), "node 4 (CheckpointLoaderSimple)") {
				t.Errorf("error %q does not name the node", err)
			}
		})
	}
	if _, err := c.Submit(t.Context(), nil); vramguard.KindOf(err) != vramguard.KindInvalidInput {
		t.Errorf("Submit(nil) = %v; want KindInvalidInput", err)
	}
}

// TestWaitWithAndWithoutWebSocket: Run returns the images once the prompt
// ends, through the WebSocket or, where /ws is refused, through /history.
func TestWaitWithAndWithoutWebSocket(t *testing.T) {
	p := newPair(t, comfyuitest.Config{})
	rp := httputil.NewSingleHostReverseProxy(p.comfy.URL())
	var wsTried int
	noWS := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/ws") {
			wsTried++
			http.Error(w, "no websockets here", http.StatusForbidden)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	defer noWS.Close()
	for _, url := range []string{p.comfy.URL().String(), noWS.URL} {
		c, err := comfyui.New(comfyui.Options{URL: url, PollInterval: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		res, err := c.Run(t.Context(), workflow(5, nil))
		if err != nil || res.Status != "success" || !res.Completed || len(res.Images) != 1 || res.Images[0].Node != "9" {
			t.Errorf("%s: Run = %+v, %v; want success with SaveImage's image", url, res, err)
		}
		c.Close()
		if _, err := c.Queue(t.Context()); !errors.Is(err, vramguard.ErrClosed) {
			t.Errorf("Queue after Close = %v; want ErrClosed", err)
		}
	}
	if wsTried == 0 {
		t.Error("the client never tried the WebSocket")
	}
}

// TestInterrupt: an interrupted prompt ends Wait with an *ExecutionError
// marked Interrupted, KindCanceled.
func TestInterrupt(t *testing.T) {
	p := newPair(t, comfyuitest.Config{})
	c := p.client(t, nil)
	q, err := c.Submit(t.Context(), workflow(500, nil)) // 5 s
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for p.comfy.Held().Work == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if err := c.Interrupt(t.Context(), q.PromptID); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := c.Wait(t.Context(), q.PromptID)
	var ee *comfyui.ExecutionError
	if !errors.As(err, &ee) || !ee.Interrupted || vramguard.KindOf(err) != vramguard.KindCanceled || res == nil || res.Status != "error" {
		t.Errorf("Wait = %+v, %v; want the interruption, KindCanceled", res, err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Wait took %v after the interrupt; want about a sampler step", d)
	}
}

// TestProcess: ComfyUI's process is the one that listens on the URL's port
// with /system_stats' argv ending its command line; another program on
// the port, or a host that is not loopback, is not taken for it.
func TestProcess(t *testing.T) {
	argv := []string{"main.py", "--port", "8189"}
	p := newPair(t, comfyuitest.Config{Argv: argv})
	port := p.comfy.URL().Port()
	for _, tt := range []struct {
		name string
		args []string
		want uint32
	}{
		{"ComfyUI", []string{"/usr/bin/python3", "/opt/ComfyUI/main.py", "--port", "8189"}, 4321},
		{"another program", []string{"/usr/bin/python3", "proxy.py", "--port", "8189"}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := fakeProc(t, port, 4321, tt.args)
			c := p.client(t, nil)
			comfyui.SetProcRoot(c, root)
			pid, err := c.Process(t.Context())
			if pid != tt.want || (tt.want == 0) != (vramguard.KindOf(err) == vramguard.KindNotFound) {
				t.Errorf("Process = %d, %v; want %d", pid, err, tt.want)
			}
		})
	}
	remote, err := comfyui.New(comfyui.Options{URL: "http://192.0.2.1:8188"})
	if err != nil {
		t.Fatal(err)
	}
	defer remote.Close()
	if _, err := remote.Process(t.Context()); vramguard.KindOf(err) != vramguard.KindNotFound || !strings.Contains(err.Error(), "Options.PID") {
		t.Errorf("Process of a remote ComfyUI = %v; want KindNotFound pointing at Options.PID", err)
	}
}

// fakeProc writes a process table with one process pid listening on port.
func fakeProc(t *testing.T, port string, pid int, args []string) string {
	t.Helper()
	root := t.TempDir()
	write := func(path, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(fmt.Sprintf("%d/stat", pid), fmt.Sprintf("%d (python3) S 1 %d %d 0 -1 4194560\n", pid, pid, pid))
	write(fmt.Sprintf("%d/cmdline", pid), strings.Join(args, "\x00")+"\x00")
	if err := os.MkdirAll(filepath.Join(root, fmt.Sprint(pid), "fd"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("socket:[777]", filepath.Join(root, fmt.Sprint(pid), "fd", "3")); err != nil {
		t.Fatal(err)
	}
	var n int
	fmt.Sscan(port, &n)
	write("net/tcp", "  sl  local_address rem_address   st ...\n"+
		fmt.Sprintf("   0: 0100007F:%04X 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1\n", n))
	return root
}
