//go:build !(linux && cgo)

package gpu

import (
	"errors"
	"strings"
	"testing"

	"github.com/vramguard/vramguard"
)

func TestNVMLReaderStub(t *testing.T) {
	r, err := NewNVMLReader(ReaderOptions{})
	if r != nil || !errors.Is(err, vramguard.KindUnavailable) || !strings.Contains(err.Error(), "cgo") {
		t.Fatalf("NewNVMLReader = %v, %v; want KindUnavailable explaining cgo", r, err)
	}
	if _, err := NewNVMLReader(ReaderOptions{SMITimeout: -1}); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Errorf("negative SMITimeout: %v", err)
	}
}
