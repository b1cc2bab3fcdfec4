package standin

import (
	"errors"
	"fmt"
)

// ErrNoGPU is the cause of a device allocation that found no usable NVIDIA
// GPU: libcuda.so.1 is missing, cuInit or cuDeviceGet failed, or the
// stand-in was built without cgo. The stand-in then runs without device
// memory, as on a CPU-only machine.
var ErrNoGPU = errors.New("no usable NVIDIA GPU")

// errDeviceOOM is the cause of an allocation the driver refused for lack
// of memory (CUDA_ERROR_OUT_OF_MEMORY).
var errDeviceOOM = errors.New("out of memory")

// DefaultCUDALibrary is the CUDA driver library the stand-in opens at run
// time; no CUDA header or toolkit is needed to build it.
const DefaultCUDALibrary = "libcuda.so.1"

// DeviceHold is device memory held by this process through the CUDA driver
// API. Release frees it (destroying the context frees every allocation in
// it); a process that exits frees it too.
type DeviceHold struct {
	Bytes  int64
	Device int    // CUDA device ordinal
	Name   string // the device's name as the driver reports it
	Free   uint64 // free device memory after the allocation, per the driver
	Total  uint64

	release func()
}

// Release frees the memory; later calls do nothing.
func (h *DeviceHold) Release() {
	if h != nil && h.release != nil {
		h.release()
		h.release = nil
	}
}

// HoldDeviceMemory allocates bytes of device memory on CUDA device 0
// through the driver API in lib (DefaultCUDALibrary when ""), opened with
// dlopen. Without a GPU it returns an error wrapping ErrNoGPU and holds
// nothing; an allocation the driver refuses (out of memory) is another
// error. It is safe to call from any goroutine: the context is created and
// used within one C call.
func HoldDeviceMemory(lib string, bytes int64) (*DeviceHold, error) {
	if bytes <= 0 {
		return nil, fmt.Errorf("standin: hold device memory: %d bytes", bytes)
	}
	if lib == "" {
		lib = DefaultCUDALibrary
	}
	return holdDeviceMemory(lib, bytes)
}
