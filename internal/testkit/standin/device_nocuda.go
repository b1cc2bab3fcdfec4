//go:build !cgo || !linux

package standin

import "fmt"

func holdDeviceMemory(lib string, bytes int64) (*DeviceHold, error) {
	return nil, fmt.Errorf("%w: the stand-in was built without cgo (or not for Linux) and cannot open %s", ErrNoGPU, lib)
}
