//go:build !(linux && cgo)

package vramguard

import (
	"errors"
	"strings"
	"testing"
)

func TestNVMLReaderStub(t *testing.T) {
	r, err := NewNVMLReader(ReaderOptions{})
	if r != nil || !errors.Is(err, KindUnavailable) || !strings.Contains(err.Error(), "cgo") {
		t.Fatalf("NewNVMLReader = %v, %v; want KindUnavailable explaining cgo", r, err)
	}
	if _, err := NewNVMLReader(ReaderOptions{SMITimeout: -1}); !errors.Is(err, KindInvalidInput) {
		t.Errorf("negative SMITimeout: %v", err)
	}
}
