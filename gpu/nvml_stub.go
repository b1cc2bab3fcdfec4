//go:build !(linux && cgo)

package gpu

import (
	"errors"

	"github.com/vramguard/vramguard"
)

// errNoNVMLBuild explains why NVML is unavailable in this build.
var errNoNVMLBuild = errors.New("nvml needs cgo on linux; this binary was built without it (use nvidia-smi)")

// NewNVMLReader always returns an *Error of KindUnavailable in this build:
// go-nvml needs cgo on Linux. NewSMIReader or NewAutoReader work without it.
// Invalid opts give KindInvalidInput, as in cgo builds.
func NewNVMLReader(opts ReaderOptions) (*DeviceReader, error) {
	const op = "new nvml reader"
	if err := opts.validate(op); err != nil {
		return nil, err
	}
	return nil, newError(op, "", vramguard.KindUnavailable, errNoNVMLBuild)
}
