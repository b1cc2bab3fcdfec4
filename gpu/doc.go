// Package gpu reads, attributes and manages GPU memory for vramguard.
//
// A [DeviceReader] reads every NVIDIA device and the processes holding its
// memory, through NVML ([NewNVMLReader], in cgo builds on Linux) or
// nvidia-smi ([NewSMIReader]); [NewAutoReader] takes the better of the
// two. It is a [vramguard.VRAMReader]: pass it as vramguard.Options.VRAM,
// to [vramguard.AwaitFree] or to [vramguard.OllamaClient.EnsureFree].
//
// # Attribution
//
// Each process is classified from its command line ([ClassifyCommand]):
// Ollama's server, the runner serving one model (and the weights blob its
// command line names), Ollama's short-lived GPU probes, or another
// program. [NameRunners] asks the Ollama server which model each runner
// serves.
//
// # Orphans
//
// A runner whose server was killed keeps its memory. [FindOrphans] reports
// such runners; [KillProcess] ends one. The library never kills anything
// by itself.
//
// # Errors
//
// Every error is a [*vramguard.Error]. The kinds these docs name
// (KindUnavailable, KindCanceled, ...) are [vramguard.Kind] values, and the
// roles (RoleOllamaRunner, ...) [vramguard.ProcessRole] values.
//
// # cgo
//
// This package holds all of the module's cgo: go-nvml, behind the linux
// && cgo build constraint. A program that imports only vramguard (and
// package nodes) compiles no C. Built without cgo, this package has the
// same API but NewNVMLReaderFrom, which takes go-nvml's nvml.Interface;
// its NewNVMLReader then reports NVML unavailable, and nvidia-smi still
// works.
package gpu
