package vramguard

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Offload reports a model that Ollama loaded partly on the CPU: VRAM was
// short, so Ollama put the layers that did not fit in system memory, and
// generation runs many times slower, with no error. Sizes are bytes as
// /api/ps lists them (size and size_vram); the CPU holds Size-SizeVRAM.
type Offload struct {
	Size     int64 // the whole model
	SizeVRAM int64 // its share on the GPU, below Size
}

// Error gives the split in bytes: "3221225472 of 6442450944 bytes on the
// GPU, 3221225472 on the CPU". An *Offload is also the error
// Options.FailOnOffload's failure wraps beside ErrOffloaded, so that
// errors.As finds the sizes of a generation that was refused.
func (o *Offload) Error() string {
	return fmt.Sprintf("%d of %d bytes on the GPU, %d on the CPU", o.SizeVRAM, o.Size, o.Size-o.SizeVRAM)
}

// offloadOf reads /api/ps and returns model's Offload when it is listed
// with size_vram below size on a server with a GPU; nil otherwise: fully
// on the GPU, not listed, or a server that cannot be told from a CPU-only
// one (no VRAM reader, a reader that sees no device or fails: size_vram is
// 0 there, which is no offload). A failed read is logged, not returned:
// the generation it checks has its own outcome. The listing goes out at
// or after since.
func (c *OllamaClient) offloadOf(ctx context.Context, model string, since time.Time) *Offload {
	if c.opts.VRAM == nil {
		return nil // cheapest first: no request at all
	}
	l, err := c.ps.get(ctx, since)
	if err == nil {
		err = l.err
	}
	if err != nil {
		c.log.Warn("offload check: cannot list running models", "model", model, "err", err)
		return nil
	}
	e := findRunning(l.resp.Models, model)
	if e == nil || e.Size <= 0 || e.SizeVRAM >= e.Size {
		return nil
	}
	// size_vram < size: a split, or a server with no GPU. Only now is the
	// GPU asked (a snapshot through nvidia-smi is a process).
	snap, err := c.opts.VRAM.Snapshot(ctx)
	switch {
	case err != nil:
		c.log.Debug("offload check: no VRAM snapshot; not flagged", "model", model, "err", err)
		return nil
	case len(snap.Devices) == 0:
		c.log.Debug("offload check: no GPU; not flagged", "model", model, "size", e.Size, "size_vram", e.SizeVRAM)
		return nil
	}
	return &Offload{Size: e.Size, SizeVRAM: e.SizeVRAM}
}

// reportOffload logs off.
func (c *OllamaClient) reportOffload(model string, off *Offload) {
	c.log.Warn("model partly on the CPU", "model", model, "size", off.Size, "size_vram", off.SizeVRAM, "cpu", off.Size-off.SizeVRAM)
}

// errOffloadStop ends a stream from the chunk callback when the model is
// offloaded and Options.FailOnOffload is set.
var errOffloadStop = errors.New("offloaded")

// failOffloaded builds FailOnOffload's error for a generation refused at
// its first chunk, after unloading the model, verified, under a context
// detached from the caller's cancellation and bounded by
// Options.CleanupTimeout (the caller's ctx may be what ended). The
// unload's failure is joined to the error, its causes reachable
// (ErrStillResident, ErrHeldByOthers...) but not its kind: the error stays
// KindOutOfMemory.
func (c *OllamaClient) failOffloaded(ctx context.Context, op, model string, off *Offload) error {
	c.reportOffload(model, off)
	cause := fmt.Errorf("%w: %w", ErrOffloaded, off)
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.CleanupTimeout)
	defer cancel()
	if _, err := c.unloadModel(uctx, model, unloadMode{keepLoads: true, cause: CauseOffload}); err != nil {
		c.log.Warn("offloaded model not unloaded", "model", model, "err", err)
		cause = errors.Join(cause, fmt.Errorf("unload: %w", kindless{err}))
	}
	return newError(op, model, KindOutOfMemory, cause)
}
