//go:build cgo && linux

package standin

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>
#include <stddef.h>

// The few CUDA driver API entry points the stand-in needs, declared here
// so that no CUDA header is needed: CUresult is an int, CUdevice an int,
// CUcontext a pointer, CUdeviceptr an unsigned 64-bit integer on 64-bit
// Linux.
typedef int (*vg_cuInit)(unsigned int);
typedef int (*vg_cuDeviceGet)(int *, int);
typedef int (*vg_cuDeviceGetName)(char *, int, int);
typedef int (*vg_cuCtxCreate)(void **, unsigned int, int);
typedef int (*vg_cuCtxDestroy)(void *);
typedef int (*vg_cuMemAlloc)(unsigned long long *, size_t);
typedef int (*vg_cuMemGetInfo)(size_t *, size_t *);

// Steps reported in vg_hold.step when something fails.
enum { VG_DLOPEN = 1, VG_DLSYM, VG_INIT, VG_DEVICE, VG_CTX, VG_ALLOC };

typedef struct {
	void *lib;
	void *ctx;
	int step;     // 0 on success, else the step that failed
	int result;   // the CUresult of that step
	char name[128];
	size_t free_bytes, total_bytes;
	char dlerr[256];
} vg_hold;

static void vg_copy_dlerror(vg_hold *h) {
	const char *e = dlerror();
	size_t i = 0;
	if (e) {
		for (; e[i] && i < sizeof(h->dlerr) - 1; i++) h->dlerr[i] = e[i];
	}
	h->dlerr[i] = 0;
}

// vg_hold_memory opens lib, creates a context on device 0 and allocates
// bytes in it. The context is left current on no thread that matters: the
// caller only ever destroys it.
static void vg_hold_memory(const char *libname, unsigned long long bytes, vg_hold *h) {
	h->lib = dlopen(libname, RTLD_NOW | RTLD_LOCAL);
	if (!h->lib) { h->step = VG_DLOPEN; vg_copy_dlerror(h); return; }
	vg_cuInit init = (vg_cuInit)dlsym(h->lib, "cuInit");
	vg_cuDeviceGet devGet = (vg_cuDeviceGet)dlsym(h->lib, "cuDeviceGet");
	vg_cuDeviceGetName devName = (vg_cuDeviceGetName)dlsym(h->lib, "cuDeviceGetName");
	vg_cuCtxCreate ctxCreate = (vg_cuCtxCreate)dlsym(h->lib, "cuCtxCreate_v2");
	vg_cuMemAlloc memAlloc = (vg_cuMemAlloc)dlsym(h->lib, "cuMemAlloc_v2");
	vg_cuMemGetInfo memInfo = (vg_cuMemGetInfo)dlsym(h->lib, "cuMemGetInfo_v2");
	if (!init || !devGet || !devName || !ctxCreate || !memAlloc || !memInfo) {
		h->step = VG_DLSYM; vg_copy_dlerror(h); return;
	}
	int dev = 0;
	if ((h->result = init(0)) != 0) { h->step = VG_INIT; return; }
	if ((h->result = devGet(&dev, 0)) != 0) { h->step = VG_DEVICE; return; }
	devName(h->name, sizeof(h->name) - 1, dev);
	if ((h->result = ctxCreate(&h->ctx, 0, dev)) != 0) { h->ctx = NULL; h->step = VG_CTX; return; }
	unsigned long long ptr = 0;
	if ((h->result = memAlloc(&ptr, (size_t)bytes)) != 0) { h->step = VG_ALLOC; return; }
	memInfo(&h->free_bytes, &h->total_bytes);
}

static void vg_release(vg_hold *h) {
	if (h->ctx && h->lib) {
		vg_cuCtxDestroy destroy = (vg_cuCtxDestroy)dlsym(h->lib, "cuCtxDestroy_v2");
		if (destroy) destroy(h->ctx);
	}
	h->ctx = NULL;
	// The library stays open: a CUDA driver is not meant to be unloaded.
}
*/
import "C"

import (
	"fmt"
	"sync"
	"unsafe"
)

// cuErrorOutOfMemory is CUDA_ERROR_OUT_OF_MEMORY (cuda.h).
const cuErrorOutOfMemory = 2

func holdDeviceMemory(lib string, bytes int64) (*DeviceHold, error) {
	clib := C.CString(lib)
	defer C.free(unsafe.Pointer(clib))
	h := (*C.vg_hold)(C.calloc(1, C.size_t(unsafe.Sizeof(C.vg_hold{}))))
	C.vg_hold_memory(clib, C.ulonglong(bytes), h)
	step, res := int(h.step), int(h.result)
	free := func() {
		C.vg_release(h)
		C.free(unsafe.Pointer(h))
	}
	switch step {
	case 0:
	case C.VG_DLOPEN:
		msg := C.GoString(&h.dlerr[0])
		free()
		return nil, fmt.Errorf("%w: dlopen %s: %s", ErrNoGPU, lib, msg)
	case C.VG_DLSYM:
		msg := C.GoString(&h.dlerr[0])
		free()
		return nil, fmt.Errorf("%w: %s lacks a driver API symbol: %s", ErrNoGPU, lib, msg)
	case C.VG_INIT:
		free()
		return nil, fmt.Errorf("%w: cuInit returned CUresult %d", ErrNoGPU, res)
	case C.VG_DEVICE:
		free()
		return nil, fmt.Errorf("%w: cuDeviceGet(0) returned CUresult %d", ErrNoGPU, res)
	case C.VG_CTX:
		free()
		return nil, fmt.Errorf("standin: cuCtxCreate_v2 returned CUresult %d", res)
	default: // C.VG_ALLOC
		free()
		if res == cuErrorOutOfMemory {
			return nil, fmt.Errorf("standin: cuMemAlloc_v2 of %d bytes: %w (CUresult %d)", bytes, errDeviceOOM, res)
		}
		return nil, fmt.Errorf("standin: cuMemAlloc_v2 of %d bytes returned CUresult %d", bytes, res)
	}
	d := &DeviceHold{
		Bytes:  bytes,
		Device: 0,
		Name:   C.GoString(&h.name[0]),
		Free:   uint64(h.free_bytes),
		Total:  uint64(h.total_bytes),
	}
	var once sync.Once
	d.release = func() { once.Do(free) }
	return d, nil
}
