package lease

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// validJSON is a lease file as Acquire writes it.
const validJSON = `{"v":1,"id":"0123456789abcdef","server":"127.0.0.1:11434","model":"qwen3:8b","pid":4242,"program":"caption","note":"phase 1","created":"2025-01-02T03:04:05.123456789Z"}` + "\n"

func TestParse(t *testing.T) {
	created := time.Date(2025, 1, 2, 3, 4, 5, 123456789, time.UTC)
	want := Record{Version: 1, ID: "0123456789abcdef", Server: "127.0.0.1:11434", Model: "qwen3:8b", PID: 4242, Program: "caption", Note: "phase 1", Created: created}
	// with replaces one key's value in validJSON (or adds it).
	with := func(key, value string) string {
		i := strings.Index(validJSON, `"`+key+`":`)
		if i < 0 {
			return strings.Replace(validJSON, "{", `{"`+key+`":`+value+",", 1)
		}
		j := i + len(key) + 3
		end := j + strings.IndexAny(validJSON[j:], ",}")
		if validJSON[j] == '"' {
			end = j + 1 + strings.IndexByte(validJSON[j+1:], '"') + 1
		}
		return validJSON[:j] + value + validJSON[end:]
	}
	without := func(key string) string {
		s := with(key, "0")
		return strings.Replace(s, `"`+key+`":0,`, "", 1)
	}
	until := time.Date(2025, 1, 2, 4, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		in   string
		want Record // zero: an ErrMalformed error
	}{
		{"as written", validJSON, want},
		{"no trailing newline", strings.TrimSpace(validJSON), want},
		{"spaces around", "  \n" + validJSON + "\n\t ", want},
		{"unknown fields allowed", with("future", `{"x":[1,2,{"y":null}]}`), want},
		{"until", with("until", `"2025-01-02T04:00:00Z"`), func() Record { r := want; r.Until = until; return r }()},
		{"until zero is forever", with("until", `"0001-01-01T00:00:00Z"`), want},
		{"until null is forever", with("until", `null`), want},
		{"offsets become UTC", with("until", `"2025-01-02T05:00:00+01:00"`), func() Record { r := want; r.Until = until; return r }()},
		{"no program", without("program"), func() Record { r := want; r.Program = ""; return r }()},
		{"no note", without("note"), func() Record { r := want; r.Note = ""; return r }()},
		{"model with html characters", with("model", `"a<b>&c"`), func() Record { r := want; r.Model = "a<b>&c"; return r }()},

		{"empty", "", Record{}},
		{"garbage", "\x00\xffnot json at all", Record{}},
		{"invalid UTF-8 in a string", with("note", "\"\xff\""), Record{}},
		{"truncated JSON", validJSON[:len(validJSON)/2], Record{}},
		{"truncated by one byte", strings.TrimSpace(validJSON)[:len(strings.TrimSpace(validJSON))-1], Record{}},
		{"huge file", with("note", `"`+strings.Repeat("x", MaxFileBytes)+`"`), Record{}},
		{"array", "[" + validJSON + "]", Record{}},
		{"string", `"lease"`, Record{}},
		{"null", `null`, Record{}},
		{"two objects", validJSON + validJSON, Record{}},
		{"data after the object", validJSON + "x", Record{}},
		{"duplicate key", with("model", `"a","model":"b"`), Record{}},
		{"key in another case", strings.Replace(validJSON, `"model"`, `"Model"`, 1), Record{}},
		{"v 2", with("v", "2"), Record{}},
		{"v 0", with("v", "0"), Record{}},
		{"v as string", with("v", `"1"`), Record{}},
		{"v 1.0", with("v", "1.0"), Record{}},
		{"no v", without("v"), Record{}},
		{"short id", with("id", `"0123456789abcde"`), Record{}},
		{"upper-case id", with("id", `"0123456789ABCDEF"`), Record{}},
		{"id not hex", with("id", `"0123456789abcdeg"`), Record{}},
		{"id with a slash", with("id", `"../../etc/passwd"`), Record{}},
		{"no id", without("id"), Record{}},
		{"empty server", with("server", `""`), Record{}},
		{"no server", without("server"), Record{}},
		{"server a number", with("server", `11434`), Record{}},
		{"empty model", with("model", `""`), Record{}},
		{"null model", with("model", `null`), Record{}},
		{"pid 0", with("pid", "0"), Record{}},
		{"pid negative", with("pid", "-1"), Record{}},
		{"pid huge", with("pid", "1e99"), Record{}},
		{"no pid", without("pid"), Record{}},
		{"no created", without("created"), Record{}},
		{"created zero", with("created", `"0001-01-01T00:00:00Z"`), Record{}},
		{"created not a time", with("created", `"yesterday"`), Record{}},
		{"created before year 1 in UTC", with("created", `"0001-01-01T00:00:00+01:00"`), Record{}},
		{"until after year 9999 in UTC", with("until", `"9999-12-31T23:30:00-01:00"`), Record{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Parse([]byte(tt.in))
			if tt.want == (Record{}) {
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("Parse = %+v, %v; want an ErrMalformed error", got, err)
				}
				var e *Error
				if !errors.As(err, &e) || e.Op != "parse" || got != (Record{}) {
					t.Fatalf("Parse = %+v, %#v; want a zero Record and an *Error of Op parse", got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Parse = %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}

func TestEncodeParses(t *testing.T) {
	r := Record{Version: 1, ID: "fedcba9876543210", Server: "gpu:11434", Model: "m<&>", PID: 1, Created: time.Date(2030, 1, 1, 0, 0, 0, 1, time.UTC)}
	b, err := encode(r)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"until"`) || strings.Contains(string(b), `"note"`) || strings.Contains(string(b), `\u003c`) {
		t.Errorf("encode = %s: want no until, no note, no HTML escapes", b)
	}
	if got, err := Parse(b); err != nil || got != r {
		t.Fatalf("Parse(encode(r)) = %+v, %v; want %+v", got, err, r)
	}
}

func TestNormalizeServer(t *testing.T) {
	tests := []struct{ in, want string }{
		{"http://LOCALHOST:11434/", "127.0.0.1:11434"},
		{"127.0.0.1", "127.0.0.1:11434"},
		{"[::1]:1", "[::1]:1"},
		{"localhost", "127.0.0.1:11434"},
		{"", "127.0.0.1:11434"},
		{"  http://127.0.0.1:11434  ", "127.0.0.1:11434"},
		{"http://gpu-box", "gpu-box:11434"},
		{"https://gpu-box", "gpu-box:443"},
		{"HTTPS://GPU-Box:8443/ollama/", "gpu-box:8443"},
		{"gpu-box.lan.", "gpu-box.lan:11434"},
		{"http://user:secret@gpu-box:11434/api?x=1#f", "gpu-box:11434"},
		{"0.0.0.0", "127.0.0.1:11434"},
		{"0.0.0.0:11500", "127.0.0.1:11500"},
		{"[::]:11434", "[::1]:11434"},
		{"::1", "[::1]:11434"},
		{"[0:0:0:0:0:0:0:1]", "[::1]:11434"},
		{"[::ffff:10.0.0.1]:9", "10.0.0.1:9"},
		{"[FE80::1%ETH0]:5", "[fe80::1%eth0]:5"},
		{"host:011434", "host:11434"},
		{"host:", "host:11434"},
		{":11500", "127.0.0.1:11500"},
		{"host:notaport", "host:11434"},
		{"host:99999", "host:11434"},
		{"https://host:-1", "host:443"},
		{"[h]:1:2", "h:11434"},
		{"::]0", "[::1]:11434"},
		{"a. .", "a:11434"},
		{"127.0.0.1:11434", "127.0.0.1:11434"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got := NormalizeServer(tt.in)
			if got != tt.want {
				t.Fatalf("NormalizeServer(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if again := NormalizeServer(got); again != got {
				t.Fatalf("NormalizeServer(%q) = %q, not idempotent", got, again)
			}
		})
	}
}

func TestErrorMatches(t *testing.T) {
	err := error(&Error{Op: "open", Path: "/x", Kind: ErrUnsupported})
	if !errors.Is(err, ErrUnsupported) || !errors.Is(err, errors.ErrUnsupported) || errors.Is(err, ErrUnsafeDir) {
		t.Fatalf("%v: kinds do not match as documented", err)
	}
	if got, want := err.Error(), "lease open /x: leases need flock(2), which this platform lacks"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}
