//go:build !darwin && !dragonfly && !freebsd && !illumos && !linux && !netbsd && !openbsd

package lease

import (
	"errors"
	"testing"
)

func TestOpenUnsupported(t *testing.T) {
	d, err := Open(Options{})
	if d != nil || !errors.Is(err, ErrUnsupported) || !errors.Is(err, errors.ErrUnsupported) {
		t.Fatalf("Open = %v, %v; want ErrUnsupported", d, err)
	}
}
