package comfyui

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
)

// ErrBusy: ComfyUI did not answer within the request's timeout. Its
// handlers answer slowly while the worker unloads models, so this is a
// busy server (KindTransient), not one that is down (KindUnavailable).
var ErrBusy = errors.New("ComfyUI is busy")

// PromptError is ComfyUI's refusal of a graph (POST /prompt's 400): the
// error's type ("invalid_prompt", "prompt_no_outputs", "no_prompt",
// "prompt_outputs_failed_validation", ...) and, per node, what failed.
// It reaches callers inside a *vramguard.Error of KindInvalidInput.
type PromptError struct {
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
// KindOutOfMemory when the exception is an out-of-memory one, of
// KindCanceled when the prompt was interrupted, else of KindServer.
type ExecutionError struct {
	PromptID      string
	Interrupted   bool
	NodeID        string
	NodeType      string
	ExceptionType string
	Message       string
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

// outOfMemory says whether an exception is torch's out-of-memory one.
func (e *ExecutionError) outOfMemory() bool {
	m := strings.ToLower(e.ExceptionType + " " + e.Message)
	return strings.Contains(m, "outofmemory") || strings.Contains(m, "out of memory") || strings.Contains(m, "allocation on device")
}

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
