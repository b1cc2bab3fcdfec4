//go:build !(linux && cgo)

package vramguard

import (
	"context"
	"errors"
)

// errNoNVMLBuild explains why NVML is unavailable in this build.
var errNoNVMLBuild = errors.New("nvml needs cgo on linux; this binary was built without it (use nvidia-smi)")

// NVMLOptions configures an NVMLReader. In this build (no cgo, or not
// Linux) NVML is never available and the options are ignored.
type NVMLOptions struct {
	// ProcRoot is where procfs is mounted; "" means /proc.
	ProcRoot string
}

// NVMLReader reads device memory through NVML. In this build it cannot be
// created; its methods exist so that code compiles in every build.
type NVMLReader struct{}

var _ VRAMReader = (*NVMLReader)(nil)

// NewNVMLReader always returns an *Error of KindUnavailable in this build:
// go-nvml needs cgo on Linux. NewSMIReader or NewAutoReader work without it.
func NewNVMLReader(opts NVMLOptions) (*NVMLReader, error) {
	return nil, newError("new nvml reader", "", KindUnavailable, errNoNVMLBuild)
}

// Snapshot returns an *Error of KindUnavailable.
func (r *NVMLReader) Snapshot(ctx context.Context) (*VRAMSnapshot, error) {
	return nil, newError("nvml snapshot", "", KindUnavailable, errNoNVMLBuild)
}

// Close does nothing.
func (r *NVMLReader) Close() error { return nil }
