package vramguard

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"time"
)

// VRAMReader reads device memory from the GPU itself. Ollama's own figures
// (size_vram, the "unload" reply) are estimates and promises; a VRAMReader
// reports what the driver says.
//
// Implementations must be safe for concurrent use and must honour ctx.
// Package gpu (github.com/vramguard/vramguard/gpu) ships one for NVIDIA
// devices, reading through NVML or nvidia-smi; it is the only package of
// the module that needs cgo. Users plug in their own (ROCm, a remote
// agent) by implementing this.
type VRAMReader interface {
	// Snapshot returns the memory of every visible device.
	Snapshot(ctx context.Context) (*VRAMSnapshot, error)
}

// SourceNone is the Source of a report made without a VRAM reader
// (EnsureReport.Source), and what package gpu's DeviceReader.Source
// returns for a reader that reads nothing (nil or zero).
const SourceNone = "none"

// VRAMSnapshot is the state of every device at one moment.
type VRAMSnapshot struct {
	// Source names the reader that took the snapshot: package gpu's
	// readers say "nvml" or "nvidia-smi" (gpu.SourceNVML, gpu.SourceSMI);
	// other readers name themselves.
	Source  string
	Taken   time.Time
	Devices []DeviceMemory
}

// Device returns the device with the given index, or nil.
func (s *VRAMSnapshot) Device(index int) *DeviceMemory {
	if s == nil {
		return nil
	}
	for i := range s.Devices {
		if s.Devices[i].Index == index {
			return &s.Devices[i]
		}
	}
	return nil
}

// DeviceMemory is one GPU's memory. Byte counts are as the driver reports
// them; Processes is nil when the source cannot list processes
// (ProcessesKnown is false then), and empty when it listed none.
type DeviceMemory struct {
	Index          int
	Name           string
	UUID           string
	Total          uint64
	Free           uint64
	Used           uint64
	Processes      []GPUProcess
	ProcessesKnown bool
	// Reserved are other holders' reservations on the device (see
	// OllamaClient.Reserve and LeaseInfo: room another client is making
	// is among them), with what each has left (LeaseInfo.Bytes
	// less Taken), already taken out of Free: set in the snapshots an
	// OllamaClient reports (EnsureReport.Snapshot, a RoomError's
	// holders), never by a VRAMReader, whose Free is the driver's.
	Reserved []LeaseInfo
	// Overdrawn is what Reserved has left beyond the driver's free
	// memory (Free is then 0): another process took reserved bytes, and
	// that much must come back before any byte is free to this client.
	// Room-making counts it on top of the need.
	Overdrawn uint64
}

// ProcessRole says what a process holding GPU memory is, as far as the
// library can tell from its command line.
type ProcessRole uint8

// Process roles.
const (
	RoleUnknown      ProcessRole = iota // command not visible, or too bare to tell
	RoleOther                           // some other program (a user's own llama-server included)
	RoleOllamaServer                    // `ollama serve`
	// RoleOllamaRunner is a process serving one loaded model: `ollama
	// runner --model ...` (Ollama up to v0.24) or Ollama's `llama-server
	// --model ...` (v0.30 and later).
	RoleOllamaRunner
	// RoleOllamaDiscovery is a short-lived process Ollama starts to probe
	// the GPUs (`llama-server --list-devices`, a runner started without a
	// model). It holds no model and is never an orphan.
	RoleOllamaDiscovery
)

func (r ProcessRole) String() string {
	switch r {
	case RoleOther:
		return "other"
	case RoleOllamaServer:
		return "ollama server"
	case RoleOllamaRunner:
		return "ollama runner"
	case RoleOllamaDiscovery:
		return "ollama discovery"
	default:
		return "unknown"
	}
}

// GPUProcess is a process holding memory on a device. UsedKnown is false
// when the driver does not report the process's memory (UsedBytes is 0 then,
// never a guess). Command is empty when the process is not visible (another
// container or PID namespace).
type GPUProcess struct {
	PID       uint32
	UsedBytes uint64
	UsedKnown bool
	Command   string
	Role      ProcessRole
	// Blob is the digest ("sha256:<hex>") of the weights file a runner's
	// command line names; "" when it names none. It is the model's weights
	// layer, not the Digest that /api/tags and /api/ps report.
	Blob string
	// Model is the name of the model a runner serves, when known: from its
	// command line (Ollama's MLX runner) or filled in by package gpu's
	// NameRunners. "" otherwise.
	Model string
	// Orphaned reports a runner whose parent is not a live `ollama serve`
	// (after a kill -9 of the server its runners keep running, and their
	// memory). The procfs readers fill it in; false when the parent could
	// not be checked.
	Orphaned bool
}

// MaxBytes is the largest byte count the library accepts in a request
// (1 PiB); larger values are taken for a bug in the caller.
const MaxBytes = 1 << 50

const maxBytes = MaxBytes

// HolderKind says what holds a share of a device's memory.
type HolderKind string

// The holders of device memory.
const (
	HolderRunner       HolderKind = "runner"       // an Ollama runner: its model
	HolderOther        HolderKind = "other"        // another process (an Ollama server's own share included)
	HolderUnattributed HolderKind = "unattributed" // used, but by no process the driver lists with its memory
	HolderReserved     HolderKind = "reserved"     // free to the driver, reserved by another holder (DeviceMemory.Reserved)
	HolderFree         HolderKind = "free"
)

// MemoryHolder is one share of a device's memory.
type MemoryHolder struct {
	Kind HolderKind
	// Name is the runner's model (its weights blob, or "pid N", when the
	// model is not known), the other process's command ("pid N" when it
	// is not visible), or a reservation's holder and recipient
	// (LeaseInfo.String); "" for HolderUnattributed and HolderFree. PID
	// is the process, for a reservation its holder's.
	Name  string
	PID   uint32
	Bytes uint64
	// Orphaned: a runner whose `ollama serve` is gone (GPUProcess.Orphaned).
	Orphaned bool
}

// Holders splits the device's memory by holder, for metrics and answers
// to "who holds the rest": runners by model, then other processes, most
// memory first, then what no listed process accounts for, then other
// holders' reservations (DeviceMemory.Reserved: the free memory each
// keeps, what it has left, less, from the last listed, what another
// process took of it when the device is Overdrawn), then the free memory.
// Processes whose memory the driver does not report are left out (their
// memory is in the unattributed share); the shares add up to Total when
// the driver's Used and Free do.
func (d DeviceMemory) Holders() []MemoryHolder {
	ps := slices.Clone(d.Processes)
	vramSortHolders(ps)
	var out, others []MemoryHolder
	var known uint64
	for _, p := range ps {
		if !d.ProcessesKnown || !p.UsedKnown {
			continue
		}
		known += p.UsedBytes
		h := MemoryHolder{Kind: HolderOther, Name: p.Command, PID: p.PID, Bytes: p.UsedBytes, Orphaned: p.Orphaned}
		if p.Role == RoleOllamaRunner {
			h.Kind, h.Name = HolderRunner, cmp.Or(p.Model, p.Blob)
		}
		if h.Name == "" {
			h.Name = fmt.Sprintf("pid %d", p.PID)
		}
		if h.Kind == HolderRunner {
			out = append(out, h)
		} else {
			others = append(others, h)
		}
	}
	out = append(out, others...)
	if d.Used > known {
		out = append(out, MemoryHolder{Kind: HolderUnattributed, Bytes: d.Used - known})
	}
	// The reservations' shares are the driver's free memory they keep:
	// what they have left less what another process took of it
	// (Overdrawn, in Used already), taken from the last listed first.
	var left uint64
	for _, r := range d.Reserved {
		left += min(r.Bytes-min(r.Bytes, r.Taken), math.MaxUint64-left) // saturates
	}
	free := left - min(left, d.Overdrawn)
	for _, r := range d.Reserved {
		b := min(r.Bytes-min(r.Bytes, r.Taken), free)
		free -= b
		out = append(out, MemoryHolder{Kind: HolderReserved, Name: r.String(), PID: uint32(r.PID), Bytes: b})
	}
	return append(out, MemoryHolder{Kind: HolderFree, Bytes: d.Free})
}
