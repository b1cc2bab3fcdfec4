// Package procs tells Ollama's processes apart by their command lines and
// reads them from procfs, without spawning ps.
//
// Ollama runs each loaded model in a child process of `ollama serve`, the
// runner. Its command line names the model's weights blob
// (`--model <models>/blobs/sha256-<hex>`), which is how a process is mapped to
// a model. Two generations of runner exist:
//
//   - up to Ollama v0.24: `ollama runner --model <blob> --port N` (with
//     `--ollama-engine` for the new engine), and before v0.5 a separate
//     `ollama_llama_server` binary;
//   - from v0.30: llama.cpp's `llama-server --model <blob> --port N --host
//     127.0.0.1 ...`, found in a lib/ollama folder next to the ollama binary.
//
// Ollama also starts short-lived discovery processes that hold no model:
// `ollama runner --ollama-engine --port N` without --model (v0.12 to v0.24),
// `ollama gpu-discover`, `llama-server --list-devices` and a llama-server
// without a model (v0.30 and later). [Classify] reports those as
// [RoleDiscovery]: they are never runners and never orphans.
//
// A runner outlives its server: after a kill -9 of `ollama serve` the runner
// keeps running, and its memory, with init (or a subreaper) as its parent.
// [Runners] reports such a runner as orphaned.
//
// # Cost
//
// [Runners] makes one pass over the procfs root: it lists the numeric
// entries, reads each process's stat (one small read), and reads the
// command line only of processes whose name (comm) could be ollama or
// llama-server. Processes that vanish during the pass are skipped.
//
// PIDs are those of the PID namespace procfs was mounted in: inside a
// container without --pid=host they are not the host PIDs NVML reports.
//
// Nothing here keeps state; every function is safe for concurrent use.
package procs
