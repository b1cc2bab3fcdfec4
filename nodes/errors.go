package nodes

import (
	"errors"
	"fmt"

	"github.com/vramguard/vramguard"
)

// ErrEmptyOutput is the cause of the KindServer error returned when a model
// replied with nothing usable once reasoning, labels and quotes were removed.
var ErrEmptyOutput = errors.New("model returned an empty prompt")

// invalid builds a KindInvalidInput error with a formatted message.
func invalid(op, model, format string, args ...any) *vramguard.Error {
	return &vramguard.Error{Op: op, Model: model, Kind: vramguard.KindInvalidInput, Err: fmt.Errorf(format, args...)}
}

// emptyOutput is the error for a reply that cleaned to nothing.
func emptyOutput(op, model string) *vramguard.Error {
	return &vramguard.Error{Op: op, Model: model, Kind: vramguard.KindServer, Err: ErrEmptyOutput}
}
