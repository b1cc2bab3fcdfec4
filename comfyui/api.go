package comfyui

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/vramguard/vramguard"
)

// SystemStats is GET /system_stats: the server and the torch device it
// runs on.
type SystemStats struct {
	System struct {
		OS             string   `json:"os"`
		RAMTotal       uint64   `json:"ram_total"`
		RAMFree        uint64   `json:"ram_free"`
		ComfyUIVersion string   `json:"comfyui_version"`
		PythonVersion  string   `json:"python_version"`
		PyTorchVersion string   `json:"pytorch_version"`
		EmbeddedPython bool     `json:"embedded_python"`
		Argv           []string `json:"argv"`
	} `json:"system"`
	Devices []StatsDevice `json:"devices"`
}

// StatsDevice is one entry of /system_stats' devices (ComfyUI lists its
// torch device only). On CUDA, VRAMFree is the driver's free memory plus
// ComfyUI's own reserved-but-unused cache, which another process cannot
// allocate: it overstates what an Ollama load would find. TorchVRAMTotal
// is what torch has reserved from the driver (models, working memory,
// cache, and what custom nodes allocated), TorchVRAMFree its unused part.
// On cpu or mps the figures are system RAM.
type StatsDevice struct {
	Name           string `json:"name"`
	Type           string `json:"type"`
	Index          int    `json:"index"`
	VRAMTotal      uint64 `json:"vram_total"`
	VRAMFree       uint64 `json:"vram_free"`
	TorchVRAMTotal uint64 `json:"torch_vram_total"`
	TorchVRAMFree  uint64 `json:"torch_vram_free"`
}

// SystemStats reads GET /system_stats within Options.StatsTimeout: a
// later answer is ErrBusy (KindTransient).
func (c *Client) SystemStats(ctx context.Context) (*SystemStats, error) {
	var st SystemStats
	if err := c.do(ctx, "comfyui: system stats", http.MethodGet, "/system_stats", nil, &st, c.opts.StatsTimeout); err != nil {
		return nil, err
	}
	return &st, nil
}

// Mode is the memory management a ComfyUI runs with.
type Mode string

const (
	// ModeUnknown: what ComfyUI reports and how it behaves do not say.
	ModeUnknown Mode = ""
	// ModeDynamicVRAM: ComfyUI 0.18 (March 2026) and later on NVIDIA,
	// unless a flag turns it off: weights held by comfy-aimdo outside
	// torch's allocator, so /system_stats' torch figures do not count
	// them, and resident while idle until /free.
	ModeDynamicVRAM Mode = "DynamicVRAM"
	// ModeModelPatcher: ComfyUI before 0.18, or started with
	// --disable-dynamic-vram, --highvram, --gpu-only, --novram or --cpu,
	// or on a device other than CUDA: models in torch's pool.
	ModeModelPatcher Mode = "ModelPatcher"
)

// dynamicVRAMOff are the flags that turn DynamicVRAM off
// (enables_dynamic_vram in ComfyUI's 2026 comfy/model_management.py).
var dynamicVRAMOff = []string{"--disable-dynamic-vram", "--highvram", "--gpu-only", "--novram", "--cpu"}

// Mode says which memory management ComfyUI reports: ModeModelPatcher
// when argv has a flag that turns DynamicVRAM off, the torch device is
// not CUDA, or the version is before 0.18; ModeDynamicVRAM for 0.18 and
// later on CUDA; ModeUnknown when the version cannot be read. A Free's
// receipt also judges by behaviour (see Receipt.Mode).
func (s *SystemStats) Mode() Mode {
	for _, a := range s.System.Argv {
		if slices.Contains(dynamicVRAMOff, strings.SplitN(a, "=", 2)[0]) {
			return ModeModelPatcher
		}
	}
	if len(s.Devices) > 0 && s.Devices[0].Type != "cuda" {
		return ModeModelPatcher
	}
	var major, minor int
	if _, err := fmt.Sscanf(s.System.ComfyUIVersion, "%d.%d", &major, &minor); err != nil {
		return ModeUnknown
	}
	if major > 0 || minor >= 18 {
		return ModeDynamicVRAM
	}
	return ModeModelPatcher
}

// GBFlag reads a ComfyUI flag that takes gigabytes (--reserve-vram,
// --vram-headroom) from system.argv, as "--flag 4" or "--flag=4": its
// value in bytes (ComfyUI multiplies by 1024³), and whether argv gives it
// a value. Newer ComfyUI may redact parts of argv.
func (s *SystemStats) GBFlag(name string) (uint64, bool) {
	argv := s.System.Argv
	for i, a := range argv {
		val, ok := "", false
		switch {
		case a == name && i+1 < len(argv):
			val, ok = argv[i+1], true
		case strings.HasPrefix(a, name+"="):
			val, ok = strings.TrimPrefix(a, name+"="), true
		}
		if !ok {
			continue
		}
		gb, err := strconv.ParseFloat(val, 64)
		if err != nil || !(gb >= 0 && gb <= 1<<20) { // NaN, negative, or past 1 PiB
			return 0, false
		}
		return uint64(gb * (1 << 30)), true
	}
	return 0, false
}

// QueueItem is one prompt in ComfyUI's queue.
type QueueItem struct {
	Number   float64
	PromptID string
}

// Queue is GET /queue: the prompt running (ComfyUI runs one at a time)
// and those waiting, in ComfyUI's heap order (not sorted).
type Queue struct {
	Running []QueueItem
	Pending []QueueItem
}

// Busy reports whether a prompt runs or waits.
func (q *Queue) Busy() bool { return len(q.Running)+len(q.Pending) > 0 }

// Queue reads GET /queue.
func (c *Client) Queue(ctx context.Context) (*Queue, error) {
	var wire struct {
		Running []json.RawMessage `json:"queue_running"`
		Pending []json.RawMessage `json:"queue_pending"`
	}
	if err := c.do(ctx, "comfyui: queue", http.MethodGet, "/queue", nil, &wire, c.opts.Timeout); err != nil {
		return nil, err
	}
	q := &Queue{Running: queueItems(wire.Running), Pending: queueItems(wire.Pending)}
	return q, nil
}

// Workflow is an API-format graph (ComfyUI's "Export (API)"): nodes by
// id. An input that takes another node's output is [id, output index].
type Workflow map[string]Node

// Node is one node of a Workflow.
type Node struct {
	ClassType string         `json:"class_type"`
	Inputs    map[string]any `json:"inputs"`
	Meta      map[string]any `json:"_meta,omitempty"`
}

// Queued is POST /prompt's answer.
type Queued struct {
	PromptID string  `json:"prompt_id"`
	Number   float64 `json:"number"`
	// NodeErrors can be set on a success: nodes ComfyUI will not run.
	NodeErrors map[string]NodeError `json:"node_errors"`
}

// Submit queues wf (POST /prompt) under the client's ClientID, with a
// prompt_id of its own making (a random UUID in the canonical lowercase
// form today's ComfyUI requires; 0.3.64 takes any), so that a prompt
// whose answer is lost can still be named. A graph ComfyUI refuses is
// KindInvalidInput with a *PromptError naming the nodes (node_errors);
// ComfyUI's 400 for a prompt_id it does not take and its 409 for one it
// has already are *PromptError values too, with their Status. When ctx
// ends before the answer, or the answer is later than Options.Timeout
// (ErrBusy), the prompt may have been queued: the error is a *WaitError
// naming the id, and Submit asks ComfyUI to cancel it.
func (c *Client) Submit(ctx context.Context, wf Workflow) (*Queued, error) {
	const op = "comfyui: submit"
	if len(wf) == 0 {
		return nil, invalidf(op, "an empty workflow")
	}
	var q Queued
	id := newID()
	body := map[string]any{"prompt": wf, "client_id": c.id, "prompt_id": id}
	if err := c.do(ctx, op, http.MethodPost, "/prompt", body, &q, c.opts.Timeout); err != nil {
		switch {
		case ctx.Err() != nil:
			c.cancelPrompt(ctx, id)
			return nil, &vramguard.Error{Op: op, Kind: ctxKind(ctx), Err: &WaitError{PromptID: id, Err: ctxCause(ctx)}}
		case errors.Is(err, ErrBusy): // no answer in time: it may be queued all the same
			c.cancelPrompt(ctx, id)
			return nil, &vramguard.Error{Op: op, Kind: vramguard.KindOf(err), Err: &WaitError{PromptID: id, Err: err}}
		}
		return nil, err
	}
	if q.PromptID == "" {
		return nil, serverf(op, "POST /prompt answered no prompt_id")
	}
	c.own.add(q.PromptID)
	return &q, nil
}

// cancelPrompt takes promptID out of ComfyUI's queue, or interrupts it
// when it runs, after the caller's ctx ended: the one wait that
// deliberately outlives it, under context.WithoutCancel(ctx) and the
// client's Timeout. ComfyUI 0.3.64 has no /api/jobs: POST /queue
// {"delete"} and POST /interrupt {"prompt_id"} do the same there, and
// are sent too (each does nothing for a prompt it does not hold).
func (c *Client) cancelPrompt(ctx context.Context, promptID string) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.Timeout)
	defer cancel()
	var out struct {
		Cancelled bool `json:"cancelled"`
	}
	err := c.do(cctx, "comfyui: cancel", http.MethodPost, "/api/jobs/"+url.PathEscape(promptID)+"/cancel", map[string]any{}, &out, c.opts.Timeout)
	if err == nil && out.Cancelled {
		return
	}
	_ = c.do(cctx, "comfyui: cancel", http.MethodPost, "/queue", map[string]any{"delete": []string{promptID}}, nil, c.opts.Timeout)
	_ = c.Interrupt(cctx, promptID)
	c.log.Debug("comfyui: prompt cancelled after its ctx ended", "prompt_id", promptID, "jobs_api", err == nil)
}

// ctxCause is why ctx ended: its cause, with ctx.Err() kept beside a
// cause of the caller's own (a generation's first-chunk timeout, say), so
// that errors.Is finds both.
func ctxCause(ctx context.Context) error {
	cause, err := context.Cause(ctx), ctx.Err()
	if err != nil && cause != nil && !errors.Is(cause, err) {
		return fmt.Errorf("%w (%w)", cause, err)
	}
	return cause
}

// ctxKind is the kind of an error for a ctx that ended: KindTimeout when
// a deadline passed, else KindCanceled.
func ctxKind(ctx context.Context) vramguard.Kind {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		return vramguard.KindTimeout
	}
	return vramguard.KindCanceled
}

// Interrupt asks ComfyUI to stop promptID (POST /interrupt); "" stops
// whatever runs. ComfyUI acts only before a node or at the next sampler
// step, and does nothing for a prompt that is not running.
func (c *Client) Interrupt(ctx context.Context, promptID string) error {
	var body any = map[string]string{}
	if promptID != "" {
		body = map[string]string{"prompt_id": promptID}
	}
	return c.do(ctx, "comfyui: interrupt", http.MethodPost, "/interrupt", body, nil, c.opts.Timeout)
}

// queueItems decodes [number, prompt_id, prompt, extra_data, outputs]
// entries, skipping what does not have that shape.
func queueItems(raws []json.RawMessage) []QueueItem {
	var out []QueueItem
	for _, raw := range raws {
		var item []json.RawMessage
		if json.Unmarshal(raw, &item) != nil || len(item) < 2 {
			continue
		}
		var it QueueItem
		_ = json.Unmarshal(item[0], &it.Number)
		if json.Unmarshal(item[1], &it.PromptID) == nil && it.PromptID != "" {
			out = append(out, it)
		}
	}
	return out
}

// history reads GET /history/{id}: nil while the prompt has not ended.
func (c *Client) history(ctx context.Context, id string) (*historyEntry, error) {
	var h map[string]historyEntry
	if err := c.do(ctx, "comfyui: history", http.MethodGet, "/history/"+url.PathEscape(id), nil, &h, c.opts.Timeout); err != nil {
		return nil, err
	}
	e, ok := h[id]
	if !ok {
		return nil, nil
	}
	return &e, nil
}

type historyEntry struct {
	Outputs map[string]json.RawMessage `json:"outputs"`
	Status  struct {
		StatusStr string              `json:"status_str"`
		Completed bool                `json:"completed"`
		Messages  [][]json.RawMessage `json:"messages"`
	} `json:"status"`
}

func invalidf(op, format string, args ...any) error {
	return &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: fmt.Errorf(format, args...)}
}

func serverf(op, format string, args ...any) error {
	return &vramguard.Error{Op: op, Kind: vramguard.KindServer, Err: fmt.Errorf(format, args...)}
}
