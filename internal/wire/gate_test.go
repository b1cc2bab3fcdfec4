package wire

import (
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestReadGateUnload(t *testing.T) {
	hdr := func(v string) http.Header {
		h := http.Header{}
		if v != "" {
			h.Set(GateHeader, v)
		}
		return h
	}
	tests := []struct {
		name            string
		header, trailer http.Header
		body            string
		want            GateUnload
	}{
		{name: "Ollama's own reply", body: `{"model":"tiny","done":true,"done_reason":"unload"}`},
		{name: "the gate's object and header",
			header: hdr("verified; checked=ps+runner-processes"),
			body:   `{"model":"tiny","done":true,"vramgate":{"model":"tiny","verified":true,"checked":"ps+runner-processes","runner_seen":true}}` + "\n",
			want: GateUnload{Said: true, Object: true, Model: "tiny", Verified: true, Checked: "ps+runner-processes", RunnerSeen: true,
				Header: "verified; checked=ps+runner-processes"}},
		{name: "streamed: the last line with an object counts, the trailer read",
			trailer: hdr("verified"),
			body:    "{\"vramgate\":{\"verified\":false}}\n{\"done\":true,\"vramgate\":{\"verified\":true,\"checked\":\"ps\",\"no_runner_check\":\"remote\\nserver\"}}\n",
			want:    GateUnload{Said: true, Object: true, Verified: true, Checked: "ps", NoRunnerCheck: "remote server", Header: "verified"}},
		{name: "a header, a malformed object", header: hdr("verified"), body: `{"vramgate":{"verified":"yes"}}`,
			want: GateUnload{Said: true, Header: "verified"}},
		{name: "a null object", body: `{"vramgate":null}`},
		{name: "not JSON", body: `"vramgate" <html>`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ReadGateUnload(tt.header, tt.trailer, []byte(tt.body)); got != tt.want {
				t.Errorf("got %+v\nwant %+v", got, tt.want)
			}
		})
	}
	long := strings.Repeat("é", 2000)
	g := ReadGateUnload(hdr(long), nil, nil)
	if len(g.Header) > maxGateLine+len("…") || !utf8.ValidString(g.Header) {
		t.Errorf("a long header kept as %d bytes (valid UTF-8 %v)", len(g.Header), utf8.ValidString(g.Header))
	}
}

// FuzzReadGateUnload: any header and body are read without a panic, into
// one-line texts of bounded length, and an answer is the gate's only when
// it carried the header or the object.
func FuzzReadGateUnload(f *testing.F) {
	f.Add("verified; checked=ps", []byte(`{"vramgate":{"model":"tiny","verified":true,"checked":"ps+runner-processes"}}`))
	f.Add("", []byte("{\"vramgate\":{}}\n{\"vramgate\":1}\n"))
	f.Add("x\ny", []byte(`{"vramgate":{"no_runner_check":"a\u2028b"}}`))
	f.Fuzz(func(t *testing.T, header string, body []byte) {
		h := http.Header{GateHeader: {header}}
		g := ReadGateUnload(h, nil, body)
		if g.Said != (g.Object || g.Header != "") {
			t.Fatalf("Said %v with object %v, header %q", g.Said, g.Object, g.Header)
		}
		if !g.Object && (g.Verified || g.Checked != "" || g.Model != "" || g.NoRunnerCheck != "" || g.RunnerCheckBy != "" || g.RunnerSeen) {
			t.Fatalf("fields without an object: %+v", g)
		}
		for _, s := range []string{g.Header, g.Model, g.Checked, g.NoRunnerCheck, g.RunnerCheckBy} {
			if strings.ContainsAny(s, "\r\n") || len(s) > maxGateLine+len("…") {
				t.Fatalf("a text of %d bytes, or of more than one line: %q", len(s), s)
			}
		}
	})
}
