package vramguard

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/ollama/ollama/api"
)

// ChatRequest is one chat turn: the conversation so far, and what the
// model may answer with. Model and at least one message are required.
type ChatRequest struct {
	Model string
	// Messages are passed through as they are: roles "system", "user",
	// "assistant" and "tool", content, images (checked as in
	// GenerateRequest.Images), the assistant's tool calls and the tools'
	// results (ToolName, ToolCallID). Append Generation.Message to carry
	// a reply into the next turn.
	Messages []api.Message
	// Tools the model may call; its calls come back in
	// Generation.ToolCalls (and Chunk.ToolCalls as they stream).
	Tools api.Tools
	// Format asks for structured output: "json" or a JSON schema object,
	// as in GenerateRequest.Format.
	Format json.RawMessage
	// Think asks a thinking model to think (true) or not (false); nil
	// leaves the model's default.
	Think *bool
	// Options are Ollama's model options, as in GenerateRequest.Options.
	Options map[string]any
	// Timeouts override the client's for this call (zero fields inherit).
	Timeouts Timeouts
}

// chatRoles are the roles Ollama's chat templates know.
var chatRoles = [...]string{"system", "user", "assistant", "tool"}

func (r *ChatRequest) validate(op string) error {
	if r == nil {
		return invalid(op, "", "request is nil")
	}
	if err := validCommon(op, r.Model, r.Timeouts, r.Options, r.Format); err != nil {
		return err
	}
	if len(r.Messages) == 0 {
		// A chat without messages is Ollama's unload request: sending it
		// would unload the model, unverified, instead of chatting.
		return invalid(op, r.Model, "no messages (a chat without messages is an unload: use UnloadModel)")
	}
	size, imageBytes := 0, 0
	for i, m := range r.Messages {
		where := fmt.Sprintf("message %d", i+1)
		role := strings.ToLower(m.Role)
		if !slices.Contains(chatRoles[:], role) {
			return invalid(op, r.Model, "%s: role %q is not system, user, assistant or tool", where, m.Role)
		}
		if !utf8.ValidString(m.Content) || !utf8.ValidString(m.Thinking) || !utf8.ValidString(m.ToolName) {
			return invalid(op, r.Model, "%s is not valid UTF-8", where)
		}
		size += len(m.Content) + len(m.Thinking)
		for j, img := range m.Images {
			if err := validImage(op, r.Model, fmt.Sprintf("%s, image %d", where, j+1), img, &imageBytes); err != nil {
				return err
			}
		}
		for j, tc := range m.ToolCalls {
			if _, err := json.Marshal(tc); err != nil {
				return invalid(op, r.Model, "%s, tool call %d: %v", where, j+1, err)
			}
		}
	}
	if size > MaxPromptBytes {
		return invalid(op, r.Model, "messages of %d bytes exceed %d", size, MaxPromptBytes)
	}
	if len(r.Tools) > 0 {
		if _, err := json.Marshal(r.Tools); err != nil {
			return invalid(op, r.Model, "tools: %v", err)
		}
	}
	return nil
}

// hasImages reports whether a message carries an image.
func (r *ChatRequest) hasImages() bool {
	for _, m := range r.Messages {
		if len(m.Images) > 0 {
			return true
		}
	}
	return false
}

// ChatStreaming runs one chat turn, streaming the reply to fn (which may
// be nil), and returns it whole: Generation.Text is the message's content,
// Generation.ToolCalls the tools it calls, Generation.Message the
// message to append to the conversation.
//
// It keeps every promise of GenerateStreaming: keepAlive sent explicitly;
// first-chunk, idle and total timeouts that cancel the server-side
// request; failures classified by Kind; a stream that ends without done
// never a success; the client's book of models in flight, so that
// unloads, guards and phases count it; images and Format checked before
// anything is sent; budget admission and the offload check. A chat model
// is unloaded like any other (UnloadModel).
//
// With Options.Fallback, a failed chat is not retried through the CLI,
// which cannot carry messages, tools or images: the error wraps
// ErrFallbackUnsupported next to its own cause.
func (c *OllamaClient) ChatStreaming(ctx context.Context, req *ChatRequest, keepAlive KeepAlive, fn ChunkFunc) (*Generation, error) {
	const op = "chat"
	if err := req.validate(op); err != nil {
		return nil, err
	}
	r := *req
	r.Format = normFormat(r.Format)
	cl := &call{
		op:       op,
		model:    r.Model,
		options:  r.Options,
		timeouts: r.Timeouts,
		images:   r.hasImages(),
		noCLI:    "chat",
		send: func(ctx context.Context, own bool, ka *api.Duration, fn func(piece) error) error {
			ar := &api.ChatRequest{
				Model:     r.Model,
				Messages:  r.Messages,
				Tools:     r.Tools,
				Format:    r.Format,
				Options:   r.Options,
				KeepAlive: ka,
			}
			if r.Think != nil {
				ar.Think = &api.ThinkValue{Value: *r.Think}
			}
			h := func(m api.ChatResponse) error {
				return fn(piece{
					text:       m.Message.Content,
					thinking:   m.Message.Thinking,
					toolCalls:  m.Message.ToolCalls,
					done:       m.Done,
					doneReason: m.DoneReason,
					metrics:    m.Metrics,
					at:         m.CreatedAt,
				})
			}
			if own {
				return c.chatNDJSON(ctx, ar, h)
			}
			return c.api.Chat(ctx, ar, h)
		},
	}
	return c.run(ctx, cl, keepAlive, fn)
}

// Message returns the reply as an assistant message, to append to a
// chat's messages for the next turn.
func (g *Generation) Message() api.Message {
	return api.Message{Role: "assistant", Content: g.Text, Thinking: g.Thinking, ToolCalls: g.ToolCalls}
}
