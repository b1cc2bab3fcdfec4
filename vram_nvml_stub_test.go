//go:build !(linux && cgo)

package vramguard

import (
	"errors"
	"strings"
	"testing"
)

func TestNVMLReaderStub(t *testing.T) {
	r, err := NewNVMLReader(NVMLOptions{})
	if r != nil || !errors.Is(err, KindUnavailable) || !strings.Contains(err.Error(), "cgo") {
		t.Fatalf("NewNVMLReader = %v, %v; want KindUnavailable explaining cgo", r, err)
	}
	var zero NVMLReader
	if _, err := zero.Snapshot(t.Context()); !errors.Is(err, KindUnavailable) {
		t.Errorf("Snapshot = %v", err)
	}
	if err := zero.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
}
