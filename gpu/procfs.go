package gpu

import (
	"strings"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/internal/procs"
)

// ProcRunners lists the Ollama runners this machine's process table shows,
// sorted by PID, with no GPU and no driver needed: each is a runner
// (RoleOllamaRunner) whose memory is not known (UsedKnown false), with its
// Command, the weights Blob its command line names (or the Model, for
// Ollama's MLX runner) and Orphaned when its parent is known not to be a
// live `ollama serve`. NameRunners then names the model each one serves.
//
// procRoot is a procfs mount; "" means /proc. It fails with
// KindUnavailable when procRoot cannot be listed (no procfs: not Linux, or
// a sandbox); processes that vanish or cannot be read during the pass are
// left out; none found is nil. A runner of a server in another PID
// namespace is not seen.
func ProcRunners(procRoot string) ([]vramguard.GPUProcess, error) {
	rs, err := procs.Runners(procRoot)
	if err != nil {
		return nil, &vramguard.Error{Op: "runners", Kind: vramguard.KindUnavailable, Err: err}
	}
	var out []vramguard.GPUProcess
	for _, r := range rs {
		out = append(out, vramguard.GPUProcess{
			PID: uint32(r.PID), Command: strings.Join(r.Args, " "), Role: vramguard.RoleOllamaRunner,
			Blob: r.Blob, Model: r.Model, Orphaned: r.Orphaned,
		})
	}
	return out, nil
}
