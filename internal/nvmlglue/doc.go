// Package nvmlglue reads device memory and GPU processes through NVML
// (github.com/NVIDIA/go-nvml), behind the traps NVML sets for its callers.
//
// The package holds code only in cgo builds on Linux (go-nvml does not
// compile without cgo); in other builds it is empty, and the root package
// reports NVML as unavailable.
//
// # Rules kept here
//
//   - No NVML call is made unless Init succeeded: after a failed Init any
//     other call can kill the process (an undefined symbol, exit 127).
//   - One Shutdown for each successful Init.
//   - nvml.Return implements error, so results are compared with
//     nvml.SUCCESS, never with nil; failures are wrapped with %w so that
//     errors.Is(err, nvml.ERROR_...) works.
//   - GetMemoryInfo_v2 is called only when the library exports the symbol.
//   - Process entries are sanity-checked: some R535 drivers return garbage
//     after the first entry.
//
// It returns plain structs of its own; the root package converts them.
package nvmlglue
