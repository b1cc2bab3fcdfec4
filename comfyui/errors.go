package comfyui

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
)

// ErrBusy: ComfyUI did not answer within the request's timeout. Its
// handlers answer slowly while the worker unloads models, so this is a
// busy server (KindTransient), not one that is down (KindUnavailable).
var ErrBusy = errors.New("ComfyUI is busy")

// PromptError is ComfyUI's refusal of a prompt: POST /prompt's 400 for a
// graph (the error's type, "invalid_prompt", "prompt_no_outputs",
// "no_prompt", "prompt_outputs_failed_validation", ..., and per node what
// failed) or for a prompt_id today's ComfyUI does not take
// ("invalid_prompt_id"), and its 409 for a prompt_id it has already
// ("prompt_id already exists"). It reaches callers inside a
// *vramguard.Error of KindInvalidInput.
type PromptError struct {
	// Status is the HTTP status: 400 or 409.
	Status     int                  `json:"-"`
	Type       string               `json:"type"`
	Message    string               `json:"message"`
	Details    string               `json:"details"`
	NodeErrors map[string]NodeError `json:"-"`
}

func (e *PromptError) Error() string {
	var b strings.Builder
	b.WriteString("ComfyUI refused the prompt")
	if e.Type != "" {
		fmt.Fprintf(&b, " (%s)", e.Type)
	}
	if e.Message != "" {
		b.WriteString(": " + strings.TrimSuffix(e.Message, "."))
	}
	if e.Details != "" {
		b.WriteString(": " + e.Details)
	}
	ids := make([]string, 0, len(e.NodeErrors))
	for id := range e.NodeErrors {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		for _, ne := range e.NodeErrors[id].Errors {
			fmt.Fprintf(&b, "; node %s (%s): %s", id, e.NodeErrors[id].ClassType, cmpOr(ne.Details, ne.Message))
		}
	}
	return b.String()
}

// NodeError is what ComfyUI found wrong with one node of a graph.
type NodeError struct {
	Errors []struct {
		Type    string `json:"type"`
		Message string `json:"message"`
		Details string `json:"details"`
	} `json:"errors"`
	DependentOutputs []string `json:"dependent_outputs"`
	ClassType        string   `json:"class_type"`
}

// ExecutionError is a prompt that ended in error or was interrupted, as
// its history says. Wait returns it inside a *vramguard.Error: of
// KindOutOfMemory when the exception is an out-of-memory one (torch's
// OutOfMemoryError or "CUDA out of memory", DynamicVRAM's RuntimeError
// "VRAM grow failed: N bytes", or another "out of memory" text), of
// KindCanceled when the prompt was interrupted, else of KindServer.
type ExecutionError struct {
	PromptID      string
	Interrupted   bool
	NodeID        string
	NodeType      string
	ExceptionType string
	Message       string
	// Bytes is the allocation that failed, for an out-of-memory error
	// whose text gives it ("VRAM grow failed: N bytes", torch's "Tried to
	// allocate 4.00 GiB"); zero otherwise.
	Bytes uint64
}

func (e *ExecutionError) Error() string {
	if e.Interrupted {
		return fmt.Sprintf("prompt %s was interrupted at node %s (%s)", e.PromptID, e.NodeID, e.NodeType)
	}
	if e.NodeID == "" {
		return fmt.Sprintf("prompt %s failed: %s", e.PromptID, cmpOr(e.Message, "no message"))
	}
	return fmt.Sprintf("prompt %s failed at node %s (%s): %s: %s", e.PromptID, e.NodeID, e.NodeType, e.ExceptionType, strings.TrimSpace(e.Message))
}

// outOfMemory says whether an exception is an out-of-memory one: torch's
// (OutOfMemoryError, "CUDA out of memory", "allocation on device") or
// comfy-aimdo's "VRAM grow failed" (FIELD_NOTES §9), the texts matched in
// this one place.
func (e *ExecutionError) outOfMemory() bool {
	m := strings.ToLower(e.ExceptionType + " " + e.Message)
	return strings.Contains(m, "outofmemory") || strings.Contains(m, "out of memory") ||
		strings.Contains(m, "allocation on device") || strings.Contains(m, "vram grow failed")
}

var (
	growFailedRE = regexp.MustCompile(`VRAM grow failed: (\d+)`)
	triedRE      = regexp.MustCompile(`Tried to allocate (\d+(?:\.\d+)?) (bytes|KiB|MiB|GiB)`)
)

// oomBytes is the allocation an out-of-memory text names; 0 when none.
func oomBytes(msg string) uint64 {
	if m := growFailedRE.FindStringSubmatch(msg); m != nil {
		n, _ := strconv.ParseUint(m[1], 10, 64)
		return n
	}
	if m := triedRE.FindStringSubmatch(msg); m != nil {
		f, _ := strconv.ParseFloat(m[1], 64)
		unit := map[string]float64{"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m[2]]
		if f*unit < 1<<60 {
			return uint64(f * unit)
		}
	}
	return 0
}

// WaitError is a wait for ComfyUI that ended before ComfyUI was done: a
// prompt's (Wait, Run, Submit) or a tenant's (the queue to drain, a free
// to settle) whose ctx or bound ended. It names the prompt (the one
// waited for, or running), how many were in the queue, and, for a
// tenant's free, the receipt so far. Err is the cause (ctx's, or the
// bound's): errors.Is(err, context.DeadlineExceeded) when a deadline
// passed. It reaches callers inside a *vramguard.Error of KindTimeout
// (a deadline) or KindCanceled.
type WaitError struct {
	PromptID string
	Queued   int // prompts in the queue, the running one included; 0 when not read
	Waited   time.Duration
	Receipt  *Receipt // a tenant's free that had not settled; nil otherwise
	Err      error
}

func (e *WaitError) Error() string {
	var b strings.Builder
	switch {
	case e.Receipt != nil:
		b.WriteString("ComfyUI's " + e.Receipt.String())
	case e.PromptID != "" && e.Queued > 0:
		fmt.Fprintf(&b, "ComfyUI is still running prompt %s (%d in its queue)", e.PromptID, e.Queued)
	case e.PromptID != "":
		fmt.Fprintf(&b, "prompt %s had not ended", e.PromptID)
	default:
		b.WriteString("ComfyUI was not done")
	}
	if e.Waited > 0 {
		fmt.Fprintf(&b, " after %v", e.Waited.Round(time.Millisecond))
	}
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	return b.String()
}

func (e *WaitError) Unwrap() error { return e.Err }

// BusyError is a tenant's refusal to free ComfyUI while its queue runs a
// prompt (TenantOptions.WhileBusy = Refuse). It reaches callers inside a
// *vramguard.Error of KindRefused, itself inside the load's *RoomError,
// whose RetryAfter it raises (RetryAfter method).
type BusyError struct {
	PromptID string // the prompt running
	Queued   int    // prompts in the queue, the running one included
	After    time.Duration
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("ComfyUI is running prompt %s (%d in its queue); retry after %v", e.PromptID, e.Queued, e.After)
}

// RetryAfter is when to try again: TenantOptions.RetryAfter.
func (e *BusyError) RetryAfter() time.Duration { return e.After }

// Is makes a BusyError match vramguard.KindRefused.
func (e *BusyError) Is(target error) bool { return target == vramguard.KindRefused }

// FreeError is a free whose receipt shows less than it asked for: memory
// pinned or not given back (Receipt.Outcome PartlyFreed). A tenant's
// Release returns it so that room-making does not wait for memory that is
// not coming.
type FreeError struct{ Receipt *Receipt }

func (e *FreeError) Error() string { return "ComfyUI " + e.Receipt.String() }

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
