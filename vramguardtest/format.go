package vramguardtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Error texts of Ollama v0.17.4 for requests the loaded runner refuses.
const (
	// llm/server.go, Completion; %q of the raw format.
	msgBadFormat = `invalid format: %q; expected "json" or a valid JSON Schema object`
	// llm/server.go, Completion, when no grammar can be made of the schema.
	msgBadSchema = "invalid JSON schema in format"
	// runner/ollamarunner/runner.go wraps model.ErrNoVisionModel (model/model.go)
	// in NewSequence's and the completion handler's words; llm/server.go
	// passes the runner's 500 reply on.
	msgNoVision = "Failed to create new sequence: failed to process inputs: this model is missing data required for image input"
)

// jsonFormat is the schema parseFormat returns for format "json".
var jsonFormat = map[string]any{
	"type":       "object",
	"properties": map[string]any{"text": map[string]any{"type": "string"}},
}

// parseFormat reads a request's format like Ollama's llm server: nil for
// none (absent, null or ""), jsonFormat for "json", else the JSON schema
// object. Anything else is an error.
func parseFormat(raw json.RawMessage) (schema any, err error) {
	switch string(raw) {
	case "", "null", `""`:
		return nil, nil
	case `"json"`:
		return jsonFormat, nil
	}
	if raw[0] != '{' {
		return nil, fmt.Errorf(msgBadFormat, raw)
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, errors.New(msgBadSchema)
	}
	return obj, nil
}

// jsonResponse is the default reply to a request with a format: an
// instance of schema (see instance) whose strings are words derived from
// prompt, split into about n chunks, preceded by thinking chunks when
// thinking is set.
func jsonResponse(prompt string, schema any, n int, thinking bool) []Chunk {
	b, err := json.Marshal(instance(schema, strings.Join(words(prompt, n), " "), 0))
	if err != nil {
		b = []byte("{}") // unreachable: instance builds plain JSON values
	}
	var out []Chunk
	if thinking {
		out = thoughts()
	}
	size := max((len(b)+n-1)/n, 1)
	for s := string(b); s != ""; {
		k := min(size, len(s))
		out = append(out, Chunk{Text: s[:k]})
		s = s[k:]
	}
	return out
}

// instance returns a small value that satisfies schema, a decoded JSON
// schema: const or the first enum value if given, the first choice of
// anyOf or oneOf, else by type: text for a string, 0, false, null, an
// array of minItems instances of items (none by default), and for an
// object, or a schema without a type, every property and required name.
func instance(schema any, text string, depth int) any {
	s, _ := schema.(map[string]any)
	if depth > 32 {
		return nil // a self-nesting schema; real ones are shallow
	}
	if v, ok := s["const"]; ok {
		return v
	}
	if e, _ := s["enum"].([]any); len(e) > 0 {
		return e[0]
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		if alts, _ := s[k].([]any); len(alts) > 0 {
			return instance(alts[0], text, depth+1)
		}
	}
	var typ string
	switch t := s["type"].(type) {
	case string:
		typ = t
	case []any: // ["string", "null"]: the first type but null
		for _, t := range t {
			if t, _ := t.(string); t != "null" {
				typ = t
				break
			}
		}
	}
	switch typ {
	case "string":
		return text
	case "number", "integer":
		return 0
	case "boolean":
		return false
	case "null":
		return nil
	case "array":
		n, _ := s["minItems"].(float64)
		out := []any{}
		for range min(int(n), 16) { // bounded: the schema comes from a request
			out = append(out, instance(s["items"], text, depth+1))
		}
		return out
	}
	props, _ := s["properties"].(map[string]any)
	out := make(map[string]any, len(props))
	for k, p := range props {
		out[k] = instance(p, text, depth+1)
	}
	req, _ := s["required"].([]any)
	for _, k := range req {
		if k, ok := k.(string); ok {
			if _, ok := out[k]; !ok {
				out[k] = text
			}
		}
	}
	return out
}
