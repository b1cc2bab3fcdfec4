package standin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// Structured output. llama-server turns a JSON schema into a grammar that
// constrains sampling, so a model's answer is an instance of the schema
// (unless n_predict cuts it short). Ollama v0.34.4 forwards the "format" of
// a request as such a schema: /api/chat as the OpenAI "response_format"
// ({"type":"json_schema","json_schema":{"name":"schema","schema":S}}, or
// {"type":"json_object"} for "json"), /api/generate as the "json_schema"
// field of /completion (and "json" as a GBNF "grammar", which the stand-in
// does not interpret).
//
// The stand-in cannot sample under a grammar; instead it emits the smallest
// instance of a simple schema, one token per piece, with one generated word
// per string. A schema it does not know how to satisfy is ignored: the
// answer is free text, as without a schema, and stderr says so.

// maxSchemaDepth bounds the nesting of objects the stand-in follows.
const maxSchemaDepth = 16

// errSchemaUnsupported marks a schema the stand-in does not follow.
var errSchemaUnsupported = errors.New("unsupported json schema")

// schemaKeywords are the keywords the stand-in understands or may ignore
// without producing an invalid instance.
var schemaKeywords = []string{
	"type", "properties", "required", "enum", "const", "items",
	"additionalProperties", "title", "description", "default", "examples",
	"$schema", "$id",
}

// jsonSchema is the part of a JSON schema the stand-in reads.
type jsonSchema struct {
	Type       json.RawMessage   `json:"type"`
	Properties json.RawMessage   `json:"properties"`
	Required   []string          `json:"required"`
	Enum       []json.RawMessage `json:"enum"`
	Const      json.RawMessage   `json:"const"`
}

// schemaPieces returns the tokens of the minimal instance of schema:
// objects hold their required properties only, in the order of
// "properties"; strings are one word drawn from s; numbers are 0, booleans
// false, arrays empty; enum and const give their first value. An empty
// schema ({}, as "json_object" without a schema sends) gives {}. Schemas
// with other keywords (anyOf, $ref, minLength, pattern, ...) or a type the
// stand-in does not know return errSchemaUnsupported.
func schemaPieces(schema json.RawMessage, s *sampler) ([]string, error) {
	var pieces []string
	if err := schemaValue(schema, s, 0, &pieces); err != nil {
		return nil, err
	}
	return pieces, nil
}

func schemaValue(raw json.RawMessage, s *sampler, depth int, out *[]string) error {
	if depth > maxSchemaDepth {
		return fmt.Errorf("%w: nested deeper than %d", errSchemaUnsupported, maxSchemaDepth)
	}
	keys, err := objectKeys(raw)
	if err != nil {
		return fmt.Errorf("%w: %v", errSchemaUnsupported, err)
	}
	for _, k := range keys {
		if !slices.Contains(schemaKeywords, k) {
			return fmt.Errorf("%w: keyword %q", errSchemaUnsupported, k)
		}
	}
	var sc jsonSchema
	if err := json.Unmarshal(raw, &sc); err != nil {
		return fmt.Errorf("%w: %v", errSchemaUnsupported, err)
	}
	switch {
	case len(sc.Const) > 0:
		return appendJSON(out, sc.Const)
	case len(sc.Enum) > 0:
		return appendJSON(out, sc.Enum[0])
	}

	typ, err := schemaType(sc.Type)
	if err != nil {
		return err
	}
	if typ == "" && (len(sc.Properties) > 0 || len(keys) == 0) {
		typ = "object" // {} or properties without a type: an object
	}
	switch typ {
	case "object":
		return schemaObject(sc, s, depth, out)
	case "string":
		b, _ := json.Marshal(words[s.draw()%uint64(len(words))])
		*out = append(*out, string(b))
	case "integer", "number":
		*out = append(*out, "0")
	case "boolean":
		*out = append(*out, "false")
	case "null":
		*out = append(*out, "null")
	case "array":
		*out = append(*out, "[]")
	default:
		return fmt.Errorf("%w: type %q", errSchemaUnsupported, typ)
	}
	return nil
}

// schemaType reads "type": a name, or a list of names of which the first
// is used.
func schemaType(raw json.RawMessage) (string, error) {
	if len(raw) == 0 {
		return "", nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one, nil
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil && len(many) > 0 {
		return many[0], nil
	}
	return "", fmt.Errorf("%w: type %s", errSchemaUnsupported, raw)
}

func schemaObject(sc jsonSchema, s *sampler, depth int, out *[]string) error {
	names, err := objectKeys(sc.Properties)
	if err != nil {
		return fmt.Errorf("%w: properties: %v", errSchemaUnsupported, err)
	}
	var props map[string]json.RawMessage
	if len(sc.Properties) > 0 {
		if err := json.Unmarshal(sc.Properties, &props); err != nil {
			return fmt.Errorf("%w: properties: %v", errSchemaUnsupported, err)
		}
	}
	for _, r := range sc.Required {
		if _, ok := props[r]; !ok {
			return fmt.Errorf("%w: required property %q is not declared", errSchemaUnsupported, r)
		}
	}
	*out = append(*out, "{")
	first := true
	for _, name := range names {
		if !slices.Contains(sc.Required, name) {
			continue
		}
		if !first {
			*out = append(*out, ",")
		}
		first = false
		key, _ := json.Marshal(name)
		*out = append(*out, string(key)+":")
		if err := schemaValue(props[name], s, depth+1, out); err != nil {
			return err
		}
	}
	*out = append(*out, "}")
	return nil
}

// objectKeys returns the keys of a JSON object in the order they appear;
// an empty raw value has none.
func objectKeys(raw json.RawMessage) ([]string, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil, nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, errors.New("not an object")
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		k, _ := tok.(string)
		if slices.Contains(keys, k) {
			return nil, fmt.Errorf("duplicate key %q", k)
		}
		keys = append(keys, k)
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return nil, err
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	return keys, nil
}

// appendJSON appends a literal value (const, enum) as one compact piece.
func appendJSON(out *[]string, v json.RawMessage) error {
	var buf bytes.Buffer
	if err := json.Compact(&buf, v); err != nil {
		return fmt.Errorf("%w: %v", errSchemaUnsupported, err)
	}
	*out = append(*out, buf.String())
	return nil
}

// responseFormat is the OpenAI "response_format" of a chat request.
type responseFormat struct {
	Type       string          `json:"type"`
	Schema     json.RawMessage `json:"schema"` // with "json_object" (llama-server extension)
	JSONSchema struct {
		Schema json.RawMessage `json:"schema"`
	} `json:"json_schema"`
}

// chatSchema returns the schema a chat request asks for, or nil: as
// llama-server's oaicompat_chat_params_parse reads it, "response_format"
// overrides a top-level "json_schema", and a format type other than
// "text", "json_object" and "json_schema" is a 400.
func chatSchema(body chatRequest) (json.RawMessage, *apiError) {
	schema := body.JSONSchema
	if len(body.ResponseFormat) > 0 && string(body.ResponseFormat) != "null" {
		var rf responseFormat
		if err := json.Unmarshal(body.ResponseFormat, &rf); err != nil {
			return nil, badRequest(fmt.Sprintf("invalid response_format: %v", err))
		}
		switch rf.Type {
		case "json_object":
			schema = orEmptyObject(rf.Schema)
		case "json_schema":
			schema = orEmptyObject(rf.JSONSchema.Schema)
		case "", "text":
		default:
			return nil, badRequest(`response_format type must be one of "text" or "json_object", but got: ` + rf.Type)
		}
	}
	if isNull(schema) {
		return nil, nil
	}
	return schema, nil
}

func orEmptyObject(raw json.RawMessage) json.RawMessage {
	if isNull(raw) {
		return json.RawMessage(`{}`)
	}
	return raw
}

func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || string(t) == "null"
}
