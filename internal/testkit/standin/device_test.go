package standin_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard/internal/testkit/standin"
)

func TestHoldDeviceMemoryWithoutGPU(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "libcuda.so.1")
	h, err := standin.HoldDeviceMemory(missing, 1<<20)
	if !errors.Is(err, standin.ErrNoGPU) {
		t.Fatalf("HoldDeviceMemory(%s) = %v, %v; want ErrNoGPU", missing, h, err)
	}
	if h != nil {
		t.Fatalf("got a hold %+v without a GPU", h)
	}
	h.Release() // a nil hold releases nothing, without panicking

	if _, err := standin.HoldDeviceMemory(missing, 0); err == nil || errors.Is(err, standin.ErrNoGPU) {
		t.Fatalf("zero bytes: got %v, want a plain refusal", err)
	}
}

// TestDeviceBytesWithoutGPU: a runner asked to hold device memory on a
// machine without a GPU (here: a missing driver library) loads anyway,
// says why it holds nothing, and gives Ollama no error line to report.
func TestDeviceBytesWithoutGPU(t *testing.T) {
	k := fast
	k.DeviceBytes = 64 << 20
	e, _, _ := knobsEnv(t, k)
	ctx, cancel := context.WithCancel(t.Context())
	stderr := &syncBuffer{}
	addr := make(chan net.Addr, 1)
	exited := make(chan int, 1)
	go func() {
		exited <- standin.Run(ctx, standin.Config{
			Args:        []string{"--host", "127.0.0.1", "--port", "0", "--model", writeModel(t, 4096)},
			Stderr:      stderr,
			Getenv:      e.get,
			OnListen:    func(a net.Addr) { addr <- a },
			CUDALibrary: filepath.Join(t.TempDir(), "libcuda.so.1"),
		})
	}()
	defer func() {
		cancel()
		if code := <-exited; code != standin.ExitOK {
			t.Errorf("exit status %d, want %d", code, standin.ExitOK)
		}
	}()
	var a net.Addr
	select {
	case a = <-addr:
	case code := <-exited:
		exited <- code
		t.Fatalf("exited with %d before listening:\n%s", code, stderr)
	}
	waitHealthy(t, "http://"+a.String(), 10*time.Second)
	out := stderr.String()
	if !strings.Contains(out, "device_bytes 67108864 not held, running without device memory") ||
		!strings.Contains(out, "no usable NVIDIA GPU") {
		t.Fatalf("stderr lacks the no-GPU line:\n%s", out)
	}
	if msg := ollamaError(out); msg != "" {
		t.Fatalf("Ollama would report %q as the runner's error", msg)
	}
}
