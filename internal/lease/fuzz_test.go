package lease

import (
	"errors"
	"strings"
	"testing"
)

// FuzzParse: any bytes a lease file can hold (in a Shared directory
// another user writes them) parse without panic; an error is ErrMalformed;
// a record that parses is valid, and its encoding, when it fits in
// MaxFileBytes, parses back to the same record.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		validJSON,
		strings.TrimSpace(validJSON),
		strings.Replace(validJSON, `"note"`, `"until":"2025-01-02T05:00:00+01:00","x":[{}],"note"`, 1),
		strings.Replace(validJSON, `"model":"qwen3:8b"`, `"model":"a<\u2028>\ud800"`, 1),
		strings.Replace(validJSON, `"created":"2025-01-02T03:04:05.123456789Z"`, `"created":"0001-01-01T00:30:00+00:30"`, 1),
		strings.Replace(validJSON, `"created":"2025-01-02T03:04:05.123456789Z"`, `"created":"9999-12-31T23:59:59.999999999-00:00"`, 1),
		strings.Replace(validJSON, `"v":1`, `"v":1,"v":1`, 1),
		strings.Replace(validJSON, `"pid":4242`, `"pid":9223372036854775807`, 1),
		strings.Replace(validJSON, `"model"`, `"MODEL"`, 1),
		validJSON[:40],
		"", "{}", "null", "[]", `{"v":1}`, "\x00\xff", "{" + strings.Repeat(`"a":{`, 100),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Parse(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) || r != (Record{}) {
				t.Fatalf("Parse(%q) = %+v, %v: want a zero Record and ErrMalformed", b, r, err)
			}
			return
		}
		if r.Version != 1 || !validID(r.ID) || r.Server == "" || r.Model == "" || r.PID <= 0 || r.Created.IsZero() || r.Path != "" || r.UID != 0 {
			t.Fatalf("Parse(%q) = %+v: not a valid record", b, r)
		}
		again, err := encode(r)
		if err != nil {
			t.Fatalf("encode(%+v): %v", r, err)
		}
		if len(again) > MaxFileBytes {
			return // escapes (U+2028, \ufffd for lone surrogates) can lengthen it
		}
		r2, err := Parse(again)
		if err != nil || r2 != r {
			t.Fatalf("Parse(%q) = %+v, which encodes as %q and parses back as %+v, %v", b, r, again, r2, err)
		}
	})
}

// FuzzNormalizeServer: any host text normalizes without panic to a
// "host:port" that normalizes to itself.
func FuzzNormalizeServer(f *testing.F) {
	for _, s := range []string{
		"http://LOCALHOST:11434/", "127.0.0.1", "[::1]:1", "localhost", "", "https://u:p@h/x", "[a", "a]:1",
		"[x]yz", "::]0", "[h]:1:2", "a. .", "::ffff:1.2.3.4", "[fe80::1%eth0]:1", "h:1:2", " [ h ]: 1 ", "İ:1", "http://[::]:x", "..", "@",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := NormalizeServer(s)
		if again := NormalizeServer(got); again != got {
			t.Fatalf("NormalizeServer(%q) = %q, but NormalizeServer(%q) = %q", s, got, got, again)
		}
		if strings.Contains(got, "/") || !strings.Contains(got, ":") {
			t.Fatalf("NormalizeServer(%q) = %q: want host:port", s, got)
		}
	})
}
