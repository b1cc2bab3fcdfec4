package main

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/vramguard/vramguard"
)

// The handler of -listen is package probe's, tested there (TestReady,
// TestReadyBadQuery, TestMetrics, TestIsLocal, ...); these run the command.

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

// listen runs c with -host s and args until it serves, and returns the
// base URL it serves and the function that signals it (cancels its ctx)
// and returns its exit status.
func listen(t *testing.T, c *cmd, host string, args ...string) (base string, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	up := make(chan struct{})
	var once sync.Once
	stderr := &safeBuffer{onWrite: func(int) { once.Do(func() { close(up) }) }}
	c.stdout, c.stderr, c.getenv = &safeBuffer{}, stderr, func(string) string { return "" }
	exit := make(chan int, 1)
	go func() {
		exit <- c.main(ctx, append([]string{"-host", host}, args...))
	}()
	select {
	case <-up:
	case code := <-exit:
		cancel()
		t.Fatalf("exit %d before serving: %s", code, stderr.String())
	}
	m := regexp.MustCompile(`^vramwatch: serving (http://127\.0\.0\.1:\d+)/metrics and /ready\n$`).FindStringSubmatch(stderr.String())
	if m == nil {
		cancel()
		<-exit
		t.Fatalf("stderr %q", stderr.String())
	}
	var code int
	var stopOnce sync.Once
	stop = func() int {
		stopOnce.Do(func() {
			cancel() // SIGTERM
			code = <-exit
		})
		return code
	}
	t.Cleanup(func() { stop() })
	return m[1], stop
}

// The whole command: -listen serves until the signal (ctx), then shuts
// down and exits 0.
func TestListen(t *testing.T) {
	s := newSim(t, "tiny")
	c := &cmd{procRoot: t.TempDir()}
	base, stop := listen(t, c, s.URL().String(), "-listen", "127.0.0.1:0", "-gpu=false")
	if code, body := get(t, base+"/ready?model=tiny"); code != 200 || !strings.Contains(body, `"state": "resident"`) {
		t.Errorf("/ready?model=tiny: %d %s", code, body)
	}
	if code, body := get(t, base+"/ready?free=1"); code != 503 || !strings.Contains(body, "no GPU reader: device memory not measured") {
		t.Errorf("/ready?free=1 without a GPU reader: %d %s", code, body)
	}
	if code, body := get(t, base+"/metrics"); code != 200 || !strings.Contains(body, "vramguard_model_resident{") || strings.Contains(body, "vramguard_device_memory_bytes") {
		t.Errorf("/metrics: %d\n%s", code, body)
	}
	if code := stop(); code != 0 {
		t.Errorf("exit %d after the signal, want 0; stderr %q", code, c.stderr.(*safeBuffer).String())
	}
	if _, err := http.Get(base + "/ready"); err == nil {
		t.Error("still serving after the signal")
	}
	if out := c.stdout.(*safeBuffer).String(); out != "" {
		t.Errorf("stdout %q, want nothing", out)
	}
}

// -listen hands the command's GPU reader and procfs root to the handler:
// the device's memory by holder, the runner processes, and /ready?free=
// measured.
func TestListenGPU(t *testing.T) {
	s := newSim(t, "tiny")
	if err := s.Reserve("comfyui", 6*gib); err != nil {
		t.Fatal(err)
	}
	c := &cmd{newReader: gpuSim.open(s), procRoot: procTree(t, procAll...)}
	base, stop := listen(t, c, s.URL().String(), "-listen", "127.0.0.1:0")
	code, body := get(t, base+"/metrics")
	for _, l := range []string{
		`vramguard_device_memory_bytes{device="0",holder="tiny:latest",kind="runner"} 2.147483648e+09`,
		`vramguard_device_memory_bytes{device="0",holder="comfyui",kind="other"} 6.442450944e+09`,
		`vramwatch_runner_processes{model="small:latest",server_gone="true"} 1`,
	} {
		if code != 200 || !strings.Contains(body, "\n"+l+"\n") {
			t.Errorf("/metrics: %d, no line %s in:\n%s", code, l, body)
		}
	}
	if code, body := get(t, base+"/ready?free=1"); code != 200 || !strings.Contains(body, `"enough": true`) {
		t.Errorf("/ready?free=1: %d %s", code, body)
	}
	if code := stop(); code != 0 {
		t.Errorf("exit %d after the signal, want 0", code)
	}
}

// /ready?free= counts another program's reservation: the device's driver
// shows the room, but it is reserved for a render, so the watcher is not
// ready, and names the reservation.
func TestListenReadyCountsReservations(t *testing.T) {
	runtime := t.TempDir() // the default lease directory, as every program on the host finds it
	t.Setenv("XDG_RUNTIME_DIR", runtime)
	s := newSim(t)
	holder, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), VRAM: s.GPU()})
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.Reserve(t.Context(), 0, 20*gib, vramguard.ReserveOptions{For: "render 9"}); err != nil {
		t.Fatal(err)
	}
	c := &cmd{newReader: gpuSim.open(s), procRoot: procTree(t, procAll...)}
	base, stop := listen(t, c, s.URL().String(), "-listen", "127.0.0.1:0")
	code, body := get(t, base+"/ready?free="+strconv.FormatUint(8*gib, 10))
	if code != 503 || !strings.Contains(body, `"reservations": "counted"`) || !strings.Contains(body, "for render 9") {
		t.Errorf("/ready?free=8GiB beside a 20 GiB reservation: %d %s", code, body)
	}
	if code := stop(); code != 0 {
		t.Errorf("exit %d after the signal, want 0", code)
	}
}
