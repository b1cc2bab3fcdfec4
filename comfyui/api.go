package comfyui

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

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

// Submit queues wf (POST /prompt) under the client's ClientID. A graph
// ComfyUI refuses is KindInvalidInput with a *PromptError naming the
// nodes (node_errors).
func (c *Client) Submit(ctx context.Context, wf Workflow) (*Queued, error) {
	const op = "comfyui: submit"
	if len(wf) == 0 {
		return nil, invalidf(op, "an empty workflow")
	}
	var q Queued
	body := map[string]any{"prompt": wf, "client_id": c.id}
	if err := c.do(ctx, op, http.MethodPost, "/prompt", body, &q, c.opts.Timeout); err != nil {
		return nil, err
	}
	if q.PromptID == "" {
		return nil, serverf(op, "POST /prompt answered no prompt_id")
	}
	return &q, nil
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
