package nodes

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

func TestParseDualStream(t *testing.T) {
	tests := []struct {
		name, in, pos, neg string
	}{
		{"plain", "Positive: a castle\nNegative: blurry", "a castle", "blurry"},
		{"lower case", "positive: a castle\nnegative: blurry", "a castle", "blurry"},
		{"upper case", "POSITIVE: a castle\nNEGATIVE: blurry", "a castle", "blurry"},
		{"bold labels", "**Positive:** a castle\n**Negative:** blurry", "a castle", "blurry"},
		{"bold prompt labels, colon outside", "**Positive Prompt**: a castle\n**Negative Prompt**: blurry", "a castle", "blurry"},
		{"bold negative prompt label", "Positive: a castle\n**Negative Prompt:** blurry, lowres", "a castle", "blurry, lowres"},
		{"headings", "## Positive Prompt\na castle\n\n## Negative Prompt\nblurry", "a castle", "blurry"},
		{"headings with colons", "### Positive:\na castle\n### Negative:\nblurry", "a castle", "blurry"},
		{"list items", "- Positive: a castle\n- Negative: blurry", "a castle", "blurry"},
		{"numbered", "1. Positive: a castle\n2. Negative: blurry", "a castle", "blurry"},
		{"quoted sections", "Positive: \"a castle\"\nNegative: \"blurry\"", "a castle", "blurry"},
		{"multi-line sections", "Positive:\na castle,\nat dusk\n\nNegative:\nblurry,\nlowres", "a castle,\nat dusk", "blurry,\nlowres"},
		{"negative first", "Negative: blurry\nPositive: a castle", "a castle", "blurry"},
		{"preamble dropped", "Here are your prompts:\nPositive: a castle\nNegative: blurry", "a castle", "blurry"},
		{"reasoning dropped", "<think>Positive: no\nNegative: no</think>\nPositive: a castle\nNegative: blurry", "a castle", "blurry"},
		{"negative space inside positive", "Positive: a castle,\nnegative space above the towers\nNegative: blurry", "a castle,\nnegative space above the towers", "blurry"},
		{"negative space at the start", "Negative space frames a castle", "Negative space frames a castle", ""},
		{"label words mid-line", "Positive: a castle with a Negative: sign\nNegative: blurry", "a castle with a Negative: sign", "blurry"},
		{"same line", "Positive: a castle Negative: blurry", "a castle Negative: blurry", ""},
		{"missing negative", "Positive: a castle", "a castle", ""},
		{"empty negative", "Positive: a castle\nNegative:", "a castle", ""},
		{"missing positive label", "a castle\nNegative: blurry", "a castle", "blurry"},
		{"no labels", "a castle at dusk", "a castle at dusk", ""},
		{"no labels, cleaned", "**Prompt:** \"a castle\"", "a castle", ""},
		{"repeated labels, first empty", "Positive:\nNegative:\nPositive: a castle\nNegative: blurry", "a castle", "blurry"},
		{"repeated labels, first wins", "Positive: a castle\nNegative: blurry\nPositive: a tower", "a castle", "blurry"},
		{"CRLF", "Positive: a castle\r\nNegative: blurry\r\n", "a castle", "blurry"},
		{"blank", "  \n", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pos, neg := ParseDualStream(tt.in)
			if pos != tt.pos || neg != tt.neg {
				t.Errorf("ParseDualStream(%q)\n= %q, %q\nwant %q, %q", tt.in, pos, neg, tt.pos, tt.neg)
			}
		})
	}
}

func FuzzParseDualStream(f *testing.F) {
	for _, s := range []string{
		"Positive: a castle\nNegative: blurry",
		"**Positive:** a castle\n**Negative Prompt:** blurry",
		"## Positive\na castle\n## Negative\nblurry",
		"Negative: blurry\nPositive: a castle",
		"Positive: a castle,\nnegative space\nNegative: blurry",
		"<think>Positive: x</think>Positive: a\nNegative: b",
		"Positive: \"\"\nNegative: ''",
		"Positive:\nNegative:",
		"a castle",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pos, neg := ParseDualStream(s)
		for _, p := range []string{pos, neg} {
			if utf8.ValidString(s) && !utf8.ValidString(p) {
				t.Fatalf("invalid UTF-8 out of valid input: %q", p)
			}
			if again, _ := Clean(p, CleanOptions{}); again != p {
				t.Fatalf("part %q is not clean: %q", p, again)
			}
		}
		// When both labels are present at line starts, a kind's output is
		// empty only if every section under a label of that kind is blank
		// once cleaned; so both are empty only if the text after both
		// labels is.
		body, _ := Clean(s, CleanOptions{KeepLabels: true, KeepQuotes: true})
		labels := dualLabels(body)
		var sawPos, sawNeg, posText, negText bool
		for i, l := range labels {
			end := len(body)
			if i+1 < len(labels) {
				end = labels[i+1].start
			}
			section, _ := Clean(body[l.end:end], CleanOptions{})
			if l.negative {
				sawNeg, negText = true, negText || section != ""
			} else {
				sawPos, posText = true, posText || section != ""
			}
		}
		if !sawPos || !sawNeg {
			return
		}
		if (pos == "") == posText || (neg == "") == negText {
			t.Fatalf("ParseDualStream(%q) = %q, %q; sections: positive %v, negative %v", s, pos, neg, posText, negText)
		}
	})
}

// pathCounter is a transport that counts the requests to each path and
// fails those to the paths in fail with a 404.
type pathCounter struct {
	mu     sync.Mutex
	counts map[string]int
	fail   map[string]bool
}

func (p *pathCounter) RoundTrip(req *http.Request) (*http.Response, error) {
	p.mu.Lock()
	if p.counts == nil {
		p.counts = make(map[string]int)
	}
	p.counts[req.URL.Path]++
	fail := p.fail[req.URL.Path]
	p.mu.Unlock()
	if fail {
		return &http.Response{StatusCode: http.StatusNotFound, Status: "404 Not Found", Request: req, Header: http.Header{}, Body: http.NoBody}, nil
	}
	return http.DefaultTransport.RoundTrip(req)
}

func (p *pathCounter) count(path string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.counts[path]
}

// dualReplies scripts a model that answers a request with a format with
// JSON and any other with the text format.
func dualReplies(c vramguardtest.Call) []vramguardtest.Chunk {
	if len(c.Format) > 0 {
		return textChunks(`{"positive": "a castle, `, `negative space above",`, ` "negative": "blurry, lowres"}`)
	}
	return textChunks("Positive: a castle at dusk\n", "Negative: blurry")
}

func TestDualStreamFormats(t *testing.T) {
	tests := []struct {
		name      string
		version   string // the server's; "" is the simulator's default, 0.17.4-sim
		versionOK bool   // /api/version answers
		noSchema  bool
		respond   func(vramguardtest.Call) []vramguardtest.Chunk // nil: the simulator's default reply
		format    DualFormat
		pos, neg  string // "" with the default reply: only checked non-empty
	}{
		{name: "schema", versionOK: true, respond: dualReplies, format: DualJSON, pos: "a castle, negative space above", neg: "blurry, lowres"},
		{name: "schema at v0.5.0", version: "0.5.0", versionOK: true, respond: dualReplies, format: DualJSON, pos: "a castle, negative space above", neg: "blurry, lowres"},
		{name: "schema, default reply", versionOK: true, format: DualJSON},
		{name: "schema, text reply", versionOK: true, respond: respondTo("**Positive:** a castle\n", "**Negative:** blurry"), format: DualJSONAsText, pos: "a castle", neg: "blurry"},
		{name: "old server", version: "0.4.7", versionOK: true, respond: dualReplies, format: DualText, pos: "a castle at dusk", neg: "blurry"},
		{name: "source build", version: "0.0.0", versionOK: true, respond: dualReplies, format: DualText, pos: "a castle at dusk", neg: "blurry"},
		{name: "no version", respond: dualReplies, format: DualText, pos: "a castle at dusk", neg: "blurry"},
		{name: "NoSchema", versionOK: true, noSchema: true, respond: dualReplies, format: DualText, pos: "a castle at dusk", neg: "blurry"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := vramguardtest.New(vramguardtest.Config{Version: tt.version, Models: []vramguardtest.ModelConfig{{Name: "writer", RespondTo: tt.respond}}})
			t.Cleanup(s.Close)
			pc := &pathCounter{fail: map[string]bool{"/api/version": !tt.versionOK}}
			c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), HTTPClient: &http.Client{Transport: pc}, PollInterval: 5 * time.Millisecond})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			d := DualStreamRefiner{Guard: vramguard.Guard{Client: c}, Model: "writer", NoSchema: tt.noSchema}
			res, err := d.Refine(t.Context(), DualInput{Description: "a castle", Style: "fantasy"})
			if err != nil {
				t.Fatal(err)
			}
			if res.DualFormat != tt.format {
				t.Errorf("format %v, want %v", res.DualFormat, tt.format)
			}
			if tt.pos == "" && (res.Prompt == "" || res.Negative == "") || tt.pos != "" && (res.Prompt != tt.pos || res.Negative != tt.neg) {
				t.Errorf("prompts %q, %q; want %q, %q", res.Prompt, res.Negative, tt.pos, tt.neg)
			}
			wantVersion := 1
			if tt.noSchema {
				wantVersion = 0
			}
			if n := pc.count("/api/version"); n != wantVersion {
				t.Errorf("%d version requests, want %d", n, wantVersion)
			}
			calls := s.Calls("writer")
			if len(calls) != 1 {
				t.Fatalf("%d calls", len(calls))
			}
			call := calls[0]
			schema := tt.format != DualText
			if schema {
				var got, want any
				if err := json.Unmarshal(call.Format, &got); err != nil {
					t.Fatalf("format %s: %v", call.Format, err)
				}
				_ = json.Unmarshal([]byte(dualSchema), &want)
				if !reflect.DeepEqual(got, want) {
					t.Errorf("format %s, want %s", call.Format, dualSchema)
				}
			} else if len(call.Format) != 0 {
				t.Errorf("format %s sent, want none", call.Format)
			}
			if asksJSON := strings.Contains(call.Prompt, `{"positive": "<the positive prompt>"`); asksJSON != schema {
				t.Errorf("prompt asks for JSON: %v, want %v:\n%s", asksJSON, schema, call.Prompt)
			}
			if s.Listed("writer") {
				t.Error("model resident after Refine")
			}
		})
	}
}

// TestDualStreamVersionCanceled: a context that ends during the version
// request ends the call with KindCanceled, before anything is loaded.
func TestDualStreamVersionCanceled(t *testing.T) {
	s := newSim(t, vramguardtest.ModelConfig{Name: "writer", Respond: reply("Positive: a castle")})
	ctx, cancel := context.WithCancel(t.Context())
	stall := roundTripFunc(func(req *http.Request) (*http.Response, error) {
		if req.URL.Path == "/api/version" {
			cancel()
			<-req.Context().Done()
			return nil, req.Context().Err()
		}
		return http.DefaultTransport.RoundTrip(req)
	})
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), HTTPClient: &http.Client{Transport: stall}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := (&DualStreamRefiner{Guard: vramguard.Guard{Client: c}, Model: "writer"}).Refine(ctx, DualInput{Description: "a castle"})
	if res != nil || !errors.Is(err, vramguard.KindCanceled) || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %+v, %v; want a canceled error", res, err)
	}
	if n := s.Requests("writer"); n != 0 {
		t.Errorf("%d requests reached the model", n)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }
