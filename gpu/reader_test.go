package gpu

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vramguard/vramguard"
)

func TestDeviceReaderZeroValue(t *testing.T) {
	for name, r := range map[string]*DeviceReader{"zero": {}, "nil": nil} {
		if _, err := r.Snapshot(t.Context()); !errors.Is(err, vramguard.KindUnavailable) {
			t.Errorf("%s: Snapshot = %v, want KindUnavailable", name, err)
		}
		if err := r.Close(); err != nil {
			t.Errorf("%s: Close = %v", name, err)
		}
		if s := r.Source(); s != vramguard.SourceNone {
			t.Errorf("%s: Source = %q", name, s)
		}
	}
}

// TestReaderConstructorsClose: every constructor that works on any
// machine returns a *DeviceReader that a caller closes as is, after which
// Snapshot fails with KindUnavailable and Close does nothing more.
func TestReaderConstructorsClose(t *testing.T) {
	opts := ReaderOptions{ProcRoot: t.TempDir(), SMIRun: smiRecorded(t, "gpus_rtx4090.txt", "apps_empty.txt")}
	noNVML := func(ReaderOptions) (*DeviceReader, error) { return nil, errors.New("no nvml here") }
	tests := []struct {
		name string
		open func() (*DeviceReader, error)
	}{
		{"NewSMIReader", func() (*DeviceReader, error) { return NewSMIReader(opts) }},
		{"NewAutoReader without NVML", func() (*DeviceReader, error) { return newAutoReader(t.Context(), opts, noNVML) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := tt.open()
			if err != nil {
				t.Fatal(err)
			}
			var c io.Closer = r // no type assertion needed
			if r.Source() != SourceSMI {
				t.Errorf("Source = %q", r.Source())
			}
			if s, err := r.Snapshot(t.Context()); err != nil || s.Source != r.Source() {
				t.Fatalf("Snapshot = %+v, %v", s, err)
			}
			if err := c.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := r.Snapshot(t.Context()); !errors.Is(err, vramguard.KindUnavailable) || !strings.Contains(err.Error(), "closed") {
				t.Errorf("Snapshot after Close = %v", err)
			}
			if err := c.Close(); err != nil {
				t.Errorf("second Close = %v", err)
			}
			if r.Source() != SourceSMI {
				t.Errorf("Source after Close = %q", r.Source())
			}
		})
	}
}

// TestReaderOptionsInvalid: every constructor refuses a negative
// SMITimeout, and NewAutoReader tries nothing then.
func TestReaderOptionsInvalid(t *testing.T) {
	var tried atomic.Int32
	opts := ReaderOptions{SMITimeout: -1, SMIRun: func(context.Context, string, ...string) ([]byte, error) {
		tried.Add(1)
		return nil, errors.New("not expected")
	}}
	openNVML := func(ReaderOptions) (*DeviceReader, error) {
		tried.Add(1)
		return nil, errors.New("not expected")
	}
	for name, open := range map[string]func() (*DeviceReader, error){
		"NewNVMLReader":        func() (*DeviceReader, error) { return NewNVMLReader(opts) },
		"NewSMIReader":         func() (*DeviceReader, error) { return NewSMIReader(opts) },
		"NewAutoReader":        func() (*DeviceReader, error) { return NewAutoReader(t.Context(), opts) },
		"NewAutoReader (NVML)": func() (*DeviceReader, error) { return newAutoReader(t.Context(), opts, openNVML) },
	} {
		r, err := open()
		if r != nil || !errors.Is(err, vramguard.KindInvalidInput) {
			t.Errorf("%s = %v, %v; want KindInvalidInput", name, r, err)
		}
	}
	if n := tried.Load(); n != 0 {
		t.Errorf("%d readers tried with invalid options", n)
	}
}
