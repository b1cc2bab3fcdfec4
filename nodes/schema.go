package nodes

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
)

// The first Ollama version whose format takes a JSON schema (structured
// outputs, v0.5.0); older ones take only "json".
const (
	schemaMajor = 0
	schemaMinor = 5
)

// versionTimeout bounds the version request of a DualStreamRefiner call:
// a server that does not answer it in time gets the text format.
const versionTimeout = 5 * time.Second

// dualSchema is the format DualStreamRefiner sends to servers that take a
// JSON schema.
const dualSchema = `{"type":"object","properties":{"positive":{"type":"string"},"negative":{"type":"string"}},"required":["positive","negative"]}`

// DualFormat says how DualStreamRefiner asked for its two prompts and read
// them back (Result.DualFormat).
type DualFormat int

// The formats. The zero value is that of the other nodes' results.
const (
	// DualText: the "Positive:" / "Negative:" text format, read by
	// ParseDualStream. Used with a server older than v0.5.0, one whose
	// version could not be read, or NoSchema.
	DualText DualFormat = iota + 1
	// DualJSON: a JSON schema sent as the request's format, and the reply
	// read as the JSON object it asks for.
	DualJSON
	// DualJSONAsText: a JSON schema sent, but the reply was no JSON object
	// with a string "positive", so ParseDualStream read it as text.
	DualJSONAsText
)

// String returns "text", "json" or "json read as text".
func (f DualFormat) String() string {
	switch f {
	case DualText:
		return "text"
	case DualJSON:
		return "json"
	case DualJSONAsText:
		return "json read as text"
	}
	return "DualFormat(" + strconv.Itoa(int(f)) + ")"
}

// parseVersion reads an Ollama version: "0.5.0", "v0.17.4", "0.6.1-rc0",
// "0.17.4-sim". A suffix after the numbers is ignored, so a release
// candidate counts as its release. ok is false for anything that does not
// start with major.minor numbers.
func parseVersion(s string) (major, minor, patch int, ok bool) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	end := strings.IndexFunc(s, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if end >= 0 {
		s = s[:end]
	}
	parts := strings.Split(s, ".")
	if len(parts) < 2 || len(parts) > 3 {
		return 0, 0, 0, false
	}
	var n [3]int
	for i, p := range parts {
		if p == "" || len(p) > 9 {
			return 0, 0, 0, false
		}
		v, err := strconv.Atoi(p)
		if err != nil {
			return 0, 0, 0, false
		}
		n[i] = v
	}
	return n[0], n[1], n[2], true
}

// takesSchema reports whether a server of the given version takes a JSON
// schema as format. A version that cannot be parsed does not: the text
// format works everywhere. (A source build of Ollama reports 0.0.0 and is
// treated as old.)
func takesSchema(version string) bool {
	major, minor, _, ok := parseVersion(version)
	return ok && (major > schemaMajor || major == schemaMajor && minor >= schemaMinor)
}

// serverTakesSchema asks the server's version, once per call: the request
// costs milliseconds next to a generation, and a node, a plain struct that
// callers copy, has nowhere to keep a cache shared by its copies. Only the
// end of ctx is an error (KindCanceled); a version that cannot be read
// within versionTimeout means the text format.
func serverTakesSchema(ctx context.Context, st *settings) (bool, error) {
	vctx, cancel := context.WithTimeout(ctx, versionTimeout)
	defer cancel()
	v, err := st.guard.Client.API().Version(vctx)
	if ctx.Err() != nil {
		return false, &vramguard.Error{Op: st.op, Model: st.model, Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
	}
	return err == nil && takesSchema(v), nil
}

// parseDualJSON reads a reply written to dualSchema: a JSON object whose
// "positive" and "negative" are strings, each cleaned as by Clean. Key
// case is ignored and other keys are skipped; a key given twice keeps its
// first value. Reasoning and a code fence around the object are removed
// first; text after the object is ignored. A reply cut short (MaxTokens)
// keeps the strings completed before the cut. ok is false when the reply is not such an object or has no
// string "positive"; a missing or non-string "negative" leaves neg empty.
func parseDualJSON(text string) (pos, neg string, ok bool) {
	body, _ := Clean(text, CleanOptions{KeepLabels: true})
	if !strings.HasPrefix(body, "{") {
		return "", "", false
	}
	dec := json.NewDecoder(strings.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return "", "", false
	}
	var havePos, haveNeg bool
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			break
		}
		key, _ := t.(string)
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			break // cut short, or not JSON: keep what came before
		}
		var s string
		if !strings.HasPrefix(string(raw), `"`) || json.Unmarshal(raw, &s) != nil {
			continue
		}
		switch {
		case strings.EqualFold(key, "positive") && !havePos:
			pos, havePos = s, true
		case strings.EqualFold(key, "negative") && !haveNeg:
			neg, haveNeg = s, true
		}
	}
	if !havePos {
		return "", "", false
	}
	pos, _ = Clean(pos, CleanOptions{})
	neg, _ = Clean(neg, CleanOptions{})
	return pos, neg, true
}
