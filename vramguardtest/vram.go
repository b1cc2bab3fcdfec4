package vramguardtest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
)

// DefaultTotalVRAM is the simulated GPU's memory when [Config.TotalVRAM] is zero.
const DefaultTotalVRAM = 24 << 30 // 24 GiB

// Holder is one process holding memory on the simulated GPU, as an NVML
// process query would list it.
type Holder struct {
	Name   string // model short name for a runner, owner for a reservation
	Bytes  uint64
	Runner bool   // an Ollama runner (true) or a reservation made with Reserve (false)
	PID    uint32 // fake process id, unique per runner process or owner
}

// VRAMError is returned by [Server.Reserve] when the GPU has too little free
// memory. Its text mimics an allocator's: "VRAM grow failed: N bytes".
type VRAMError struct {
	Owner     string
	Requested uint64 // bytes asked for
	Free      uint64 // bytes free at the time
}

func (e *VRAMError) Error() string {
	return fmt.Sprintf("VRAM grow failed: %d bytes", e.Requested)
}

// holding is one entry of the VRAM ledger.
type holding struct {
	name   string
	bytes  uint64
	runner bool
	pid    uint32
}

// Memory reports the simulated GPU's memory: total, used by all holders,
// and free (zero when holders exceed the total, which only happens without
// [Config.StrictVRAM]). It is safe for concurrent use.
func (s *Server) Memory() (total, used, free uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	used = s.usedLocked()
	return s.totalVRAM, used, s.freeLocked()
}

// Holders lists who holds memory on the simulated GPU, ordered by PID.
// A runner holds its model's SizeVRAM (less after a [Config.Offload]
// split, and then nothing, not even an entry, when it runs wholly on the
// CPU) from the start of its load until it leaves /api/ps (plus
// [Config.ReleaseLag]); a crashed runner holds nothing.
// It is safe for concurrent use.
func (s *Server) Holders() []Holder {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Holder, 0, len(s.holdings))
	for _, h := range s.holdings {
		out = append(out, Holder{Name: h.name, Bytes: h.bytes, Runner: h.runner, PID: h.pid})
	}
	slices.SortFunc(out, func(a, b Holder) int { return cmp.Compare(a.PID, b.PID) })
	return out
}

// Reserve allocates bytes more on the simulated GPU for owner, as another
// process (say, an image pipeline loading a text encoder) would. Repeated
// calls for one owner add up. It fails with a [*VRAMError] when fewer than
// bytes are free, whatever [Config.StrictVRAM] says. It is safe for
// concurrent use.
func (s *Server) Reserve(owner string, bytes uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if free := s.freeLocked(); bytes > free {
		return &VRAMError{Owner: owner, Requested: bytes, Free: free}
	}
	h, ok := s.external[owner]
	if !ok {
		h = &holding{name: owner, pid: s.newPIDLocked()}
		s.external[owner] = h
		s.holdings[h.pid] = h
	}
	h.bytes += bytes
	s.notifyLocked()
	return nil
}

// Release frees everything owner reserved. Unknown owners are ignored.
// It is safe for concurrent use.
func (s *Server) Release(owner string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.external[owner]; ok {
		delete(s.external, owner)
		delete(s.holdings, h.pid)
		s.notifyLocked()
	}
}

func (s *Server) usedLocked() uint64 {
	var used uint64
	for _, h := range s.holdings {
		used += h.bytes
	}
	return used
}

func (s *Server) freeLocked() uint64 {
	if used := s.usedLocked(); used < s.totalVRAM {
		return s.totalVRAM - used
	}
	return 0
}

func (s *Server) newPIDLocked() uint32 {
	s.lastPID++
	return s.lastPID
}

// holdLocked records that a new runner holds its GPU share. A runner
// wholly on the CPU holds nothing: the driver does not list it.
func (s *Server) holdLocked(r *runner) {
	if r.vram == 0 {
		return
	}
	r.hold = &holding{name: r.m.short, bytes: r.vram, runner: true, pid: r.pid}
	s.holdings[r.pid] = r.hold
}

// freeLocked releases r's memory, after [Config.ReleaseLag] unless now is set.
func (s *Server) freeHoldingLocked(r *runner, now bool) {
	h := r.hold
	if h == nil {
		return
	}
	r.hold = nil
	if now || s.cfg.ReleaseLag <= 0 {
		delete(s.holdings, h.pid)
		return
	}
	s.afterLocked(s.cfg.ReleaseLag, func() { delete(s.holdings, h.pid) })
}

// SetHeld sets what owner holds on the ledger to bytes (it does not add),
// listed under name, as a process whose use grows and shrinks (a fake
// ComfyUI of package comfyuitest: its CUDA context, models and cache).
// Growth that does not fit in the free memory fails with a [*VRAMError]
// and changes nothing, whatever [Config.StrictVRAM] says; shrinking always
// succeeds; zero releases the owner. The owner keeps one PID while it
// holds anything. ctx is not used (the ledger answers at once). It is safe
// for concurrent use.
func (s *Server) SetHeld(_ context.Context, owner, name string, bytes uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.external[owner]
	var cur uint64
	if h != nil {
		cur = h.bytes
	}
	if bytes > cur {
		if free := s.freeLocked(); bytes-cur > free {
			return &VRAMError{Owner: name, Requested: bytes - cur, Free: free}
		}
	}
	switch {
	case bytes == 0:
		if h != nil {
			delete(s.external, owner)
			delete(s.holdings, h.pid)
		}
	case h == nil:
		h = &holding{name: name, bytes: bytes, pid: s.newPIDLocked()}
		s.external[owner] = h
		s.holdings[h.pid] = h
	default:
		h.bytes = bytes
	}
	s.notifyLocked()
	return nil
}

// HeldPID is the PID owner's memory ([Server.SetHeld], [Server.Reserve])
// is listed under, 0 when it holds none. It is safe for concurrent use.
func (s *Server) HeldPID(owner string) uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h, ok := s.external[owner]; ok {
		return h.pid
	}
	return 0
}

// DeviceMemory is the simulated GPU's total and free bytes, as
// [Server.Memory] reports them; it never fails. It is safe for concurrent
// use.
func (s *Server) DeviceMemory(context.Context) (total, free uint64, err error) {
	total, _, free = s.Memory()
	return total, free, nil
}
