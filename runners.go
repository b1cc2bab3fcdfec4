package vramguard

import (
	"context"
	"strings"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/internal/procs"
)

// A runner's command line names the model's weights blob
// (`--model <models>/blobs/sha256-<hex>`), while Ollama's API speaks of model
// names and of manifest digests (the Digest of /api/tags and /api/ps). The
// bridge is /api/show: the modelfile it returns starts with a `FROM <blob
// path>` line naming the same weights file.

// ModelBlob returns the digest ("sha256:<hex>") of model's weights file,
// the blob its runner's command line names (GPUProcess.Blob), as /api/show
// reports it in the modelfile's FROM line. That is not the Digest of
// /api/tags, which is the manifest's. It returns "" and no error for a
// model without a weights file of its own (a cloud model, or one whose
// FROM is no blob).
//
// A model the server does not know is KindNotFound. It fails fast with
// ErrClosed (KindUnavailable) on a closed client, and returns KindCanceled
// with context.Cause(ctx) when ctx is done.
func (c *OllamaClient) ModelBlob(ctx context.Context, model string) (string, error) {
	const op = "model blob"
	if err := validModelName(op, model); err != nil {
		return "", err
	}
	if err := c.checkOpen(op, model); err != nil {
		return "", err
	}
	return c.modelBlob(ctx, op, model)
}

func (c *OllamaClient) modelBlob(ctx context.Context, op, model string) (string, error) {
	_, blob, err := c.modelWeights(ctx, model)
	if err != nil {
		return "", c.callError(ctx, op, model, err)
	}
	return blob, nil
}

// modelWeights returns the weights file of model as the server names it
// (the FROM line of /api/show's modelfile) and its blob digest ("" when it
// is not a blob). Errors are the api client's, unclassified.
func (c *OllamaClient) modelWeights(ctx context.Context, model string) (path, blob string, err error) {
	resp, err := c.api.Show(ctx, &api.ShowRequest{Model: model})
	if err != nil {
		return "", "", err
	}
	path = modelfileFrom(resp.Modelfile)
	return path, procs.BlobOf(path), nil
}

// blobFromModelfile returns the weights blob of a modelfile as /api/show
// writes it: comment lines, then `FROM <path>` (Ollama's Model.String); ""
// when the first command is not a FROM naming a blob.
func blobFromModelfile(mf string) string {
	return procs.BlobOf(modelfileFrom(mf))
}

// modelfileFrom returns the argument of a modelfile's FROM line when it is
// the first command; "" otherwise.
func modelfileFrom(mf string) string {
	for line := range strings.Lines(mf) {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		cmd, arg, ok := strings.Cut(line, " ")
		if !ok || !strings.EqualFold(cmd, "FROM") {
			return ""
		}
		return strings.Trim(strings.TrimSpace(arg), `"`)
	}
	return ""
}

// Running lists the models the server has loaded (GET /api/ps). Ollama lists
// a model until its runner is removed, which can be before the GPU has the
// memory back, and still lists a runner that crashed. The listing is one
// whose request went out at or after the call, shared with the client's
// other callers (its unloads, other Running calls, gpu.NameRunners): at
// most one request per Options.PollInterval.
//
// On a closed client it fails with ErrClosed and sends nothing.
func (c *OllamaClient) Running(ctx context.Context) ([]api.ProcessModelResponse, error) {
	if err := c.checkOpen("list running", ""); err != nil {
		return nil, err
	}
	return c.running(ctx)
}

// running is Running for the library's own calls, which Close makes too.
// Its listing is one sent at or after the call, shared with the unloads
// in progress (poller.go).
func (c *OllamaClient) running(ctx context.Context) ([]api.ProcessModelResponse, error) {
	const op = "list running"
	l, err := c.ps.get(ctx, time.Now())
	if err == nil {
		err = l.err
	}
	resp := l.resp
	if err != nil {
		if ctx.Err() != nil {
			return nil, newError(op, "", KindCanceled, context.Cause(ctx))
		}
		return nil, newError(op, "", classify(err), err)
	}
	return resp.Models, nil
}

// runningNow is running with a listing requested at once (poller.now),
// read again once when the server fails it (Ollama up to v0.32.3
// sometimes answers /api/ps during a load or unload with a bodiless 500):
// for an admission, which reads the server before each load it admits.
func (c *OllamaClient) runningNow(ctx context.Context) ([]api.ProcessModelResponse, error) {
	const op = "list running"
	var l listing
	var err error
	for try := 0; try < 2; try++ {
		if l, err = c.ps.now(ctx); err == nil && l.err == nil {
			return l.resp.Models, nil
		}
		if err != nil || ctx.Err() != nil {
			break
		}
	}
	if err == nil {
		err = l.err
	}
	if ctx.Err() != nil {
		return nil, newError(op, "", KindCanceled, context.Cause(ctx))
	}
	return nil, newError(op, "", classify(err), err)
}

// ListModels lists the models installed on the server (GET /api/tags),
// with failures classified like every other call. On a closed client it
// fails with ErrClosed and sends nothing.
func (c *OllamaClient) ListModels(ctx context.Context) ([]api.ListModelResponse, error) {
	const op = "list models"
	if err := c.checkOpen(op, ""); err != nil {
		return nil, err
	}
	resp, err := c.api.List(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, newError(op, "", KindCanceled, context.Cause(ctx))
		}
		return nil, newError(op, "", classify(err), err)
	}
	return resp.Models, nil
}

// IsResident reports whether the server lists model as loaded. On a closed
// client it fails with ErrClosed and sends nothing.
func (c *OllamaClient) IsResident(ctx context.Context, model string) (bool, error) {
	if err := validModelName("is resident", model); err != nil {
		return false, err
	}
	ms, err := c.Running(ctx)
	if err != nil {
		return false, err
	}
	return findRunning(ms, model) != nil, nil
}
