package gpu

import (
	"cmp"
	"context"
	"slices"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
)

// A runner's command line names the model's weights blob
// (`--model <models>/blobs/sha256-<hex>`), while Ollama's API speaks of model
// names and of manifest digests (the Digest of /api/tags and /api/ps). The
// bridge is /api/show: the modelfile it returns starts with a `FROM <blob
// path>` line naming the same weights file (vramguard.OllamaClient.ModelBlob).

// Models is what NameRunners asks an Ollama server: the models it has
// loaded and installed, and the weights blob of each.
// [*vramguard.OllamaClient] implements it; its methods' doc comments say
// what each sends.
type Models interface {
	Running(ctx context.Context) ([]api.ProcessModelResponse, error)
	ListModels(ctx context.Context) ([]api.ListModelResponse, error)
	ModelBlob(ctx context.Context, model string) (string, error)
}

var _ Models = (*vramguard.OllamaClient)(nil)

// NameRunners fills in GPUProcess.Model for the Ollama runners in snap that
// have a weights blob (GPUProcess.Blob) and no name yet, by asking models
// which of its models has those weights. It changes nothing else.
//
// It asks for the loaded models (models.Running: with a
// vramguard.OllamaClient, a /api/ps listing shared with the client's other
// callers) and the blob of each (models.ModelBlob, one /api/show each);
// only when a runner is still unnamed (a load in flight, which /api/ps
// does not list yet, or a runner left over from an earlier server) does it
// go on through every installed model (models.ListModels, /api/tags), one
// ModelBlob each. Models that share a weights file (tags or copies of one
// model) share a runner: the name given is the loaded one, else the first
// in name order. A runner of a model the server does not have keeps an
// empty Model, and so does one whose model ModelBlob fails for with
// KindNotFound, KindServer or KindInvalidInput (removed meanwhile, a
// broken manifest). A snap with no runner to name costs no request and
// does not use models. Nothing is cached: a model re-created under the
// same name may have other weights, and the requests are few where it
// matters (loaded models).
//
// Any other failure of models is returned as it is: with a
// vramguard.OllamaClient, ErrClosed (KindUnavailable) on a closed client,
// KindCanceled with context.Cause(ctx) when ctx is done, and the kinds of
// its own calls otherwise (Ollama down, busy). Names found before a
// failure are kept in snap. It writes to snap: call it before sharing snap
// with other goroutines. It is safe for concurrent use on different
// snapshots if models is.
func NameRunners(ctx context.Context, models Models, snap *vramguard.VRAMSnapshot) error {
	want := make(map[string]string) // blob -> model name, "" while unknown
	for _, d := range snapDevices(snap) {
		for _, p := range d.Processes {
			if p.Role == vramguard.RoleOllamaRunner && p.Blob != "" && p.Model == "" {
				want[p.Blob] = ""
			}
		}
	}
	if len(want) == 0 {
		return nil
	}
	n := &runnerNamer{models: models, want: want, left: len(want), tried: make(map[string]bool)}
	err := n.run(ctx)
	for i := range snapDevices(snap) {
		ps := snap.Devices[i].Processes
		for j := range ps {
			if name := want[ps[j].Blob]; ps[j].Role == vramguard.RoleOllamaRunner && ps[j].Model == "" && name != "" {
				ps[j].Model = name
			}
		}
	}
	return err
}

func snapDevices(snap *vramguard.VRAMSnapshot) []vramguard.DeviceMemory {
	if snap == nil {
		return nil
	}
	return snap.Devices
}

// runnerNamer is one NameRunners call's search.
type runnerNamer struct {
	models Models
	want   map[string]string // blob -> name found
	left   int               // blobs still without a name
	tried  map[string]bool   // models already shown
}

func (n *runnerNamer) run(ctx context.Context) error {
	running, err := n.models.Running(ctx)
	if err != nil {
		return err
	}
	names := make([]string, 0, len(running))
	for _, m := range running {
		names = append(names, cmp.Or(m.Name, m.Model))
	}
	if err := n.try(ctx, names); err != nil || n.left == 0 {
		return err
	}
	installed, err := n.models.ListModels(ctx)
	if err != nil {
		return err
	}
	names = names[:0]
	for _, m := range installed {
		names = append(names, cmp.Or(m.Name, m.Model))
	}
	return n.try(ctx, names)
}

// try shows the models not shown yet, in name order, until every blob has
// a name.
func (n *runnerNamer) try(ctx context.Context, names []string) error {
	slices.Sort(names)
	for _, name := range names {
		if n.left == 0 {
			return nil
		}
		if name == "" || n.tried[name] {
			continue
		}
		n.tried[name] = true
		blob, err := n.models.ModelBlob(ctx, name)
		if err != nil {
			switch vramguard.KindOf(err) {
			case vramguard.KindNotFound, vramguard.KindServer, vramguard.KindInvalidInput:
				// Removed since it was listed, or broken (a manifest
				// whose layer is gone): that model's trouble, not the
				// search's.
				continue
			}
			return err
		}
		if found, ok := n.want[blob]; ok && found == "" {
			n.want[blob] = name
			n.left--
		}
	}
	return nil
}
