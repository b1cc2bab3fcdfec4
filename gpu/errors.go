package gpu

import (
	"fmt"

	"github.com/vramguard/vramguard"
)

// newError returns the module's error type, as the root package builds it.
func newError(op, model string, kind vramguard.Kind, err error) *vramguard.Error {
	return &vramguard.Error{Op: op, Model: model, Kind: kind, Err: err}
}

// invalid builds a KindInvalidInput error with a formatted message.
func invalid(op, model, format string, args ...any) *vramguard.Error {
	return newError(op, model, vramguard.KindInvalidInput, fmt.Errorf(format, args...))
}
