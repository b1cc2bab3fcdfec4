package nodes

import (
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestTakesSchema(t *testing.T) {
	tests := []struct {
		version string
		want    bool
	}{
		{"0.5.0", true},
		{"0.5.1", true},
		{"0.17.4", true},
		{"v0.6.2", true},
		{"0.17.4-sim", true},
		{"0.5.0-rc1", true}, // a release candidate counts as its release
		{"1.0", true},
		{" 0.12.0\n", true},
		{"0.4.7", false},
		{"0.4.99", false},
		{"0.1.32", false},
		{"0.0.0", false}, // a source build without a version
		{"", false},
		{"latest", false},
		{"0.5", true},
		{"5", false},
		{"0..5", false},
		{"0.5.0.1", false},
		{"99999999999.0.0", false},
		{".5.0", false},
		{"0.-5.0", false},
	}
	for _, tt := range tests {
		if got := takesSchema(tt.version); got != tt.want {
			t.Errorf("takesSchema(%q) = %v, want %v", tt.version, got, tt.want)
		}
	}
}

func FuzzParseVersion(f *testing.F) {
	for _, s := range []string{"0.5.0", "v0.17.4-sim", "0.0.0", "1.2", "", "0.5.0+build.1", "9.9.9.9"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		major, minor, patch, ok := parseVersion(s)
		if !ok {
			if major != 0 || minor != 0 || patch != 0 {
				t.Fatalf("parseVersion(%q) failed with numbers %d.%d.%d", s, major, minor, patch)
			}
			if takesSchema(s) {
				t.Fatalf("takesSchema(%q) with an unparsable version", s)
			}
			return
		}
		if major < 0 || minor < 0 || patch < 0 {
			t.Fatalf("parseVersion(%q) = %d.%d.%d", s, major, minor, patch)
		}
		// The numbers read back give the same verdict.
		again := strings.Join([]string{strconv.Itoa(major), strconv.Itoa(minor), strconv.Itoa(patch)}, ".")
		if takesSchema(again) != takesSchema(s) {
			t.Fatalf("takesSchema(%q) != takesSchema(%q)", s, again)
		}
	})
}

func TestParseDualJSON(t *testing.T) {
	tests := []struct {
		name, in string
		pos, neg string
		ok       bool
	}{
		{"object", `{"positive": "a castle", "negative": "blurry"}`, "a castle", "blurry", true},
		{"negative first", `{"negative": "blurry", "positive": "a castle"}`, "a castle", "blurry", true},
		{"key case", `{"Positive": "a castle", "NEGATIVE": "blurry"}`, "a castle", "blurry", true},
		{"values cleaned", `{"positive": "**Positive:** \"a castle\"", "negative": "  blurry  "}`, "a castle", "blurry", true},
		{"escapes", `{"positive": "a \"castle\",\nat dusk \u00e9", "negative": "x"}`, "a \"castle\",\nat dusk é", "x", true},
		{"other keys skipped", `{"style": {"a": [1, {"b": 2}]}, "positive": "a castle", "n": null, "negative": "blurry"}`, "a castle", "blurry", true},
		{"first of a repeated key", `{"positive": "a castle", "positive": "a tower", "negative": "blurry"}`, "a castle", "blurry", true},
		{"non-string positive then string", `{"positive": 1, "positive": "a castle"}`, "a castle", "", true},
		{"missing negative", `{"positive": "a castle"}`, "a castle", "", true},
		{"non-string negative", `{"positive": "a castle", "negative": ["blurry"]}`, "a castle", "", true},
		{"reasoning and fence", "<think>json please</think>\n```json\n{\"positive\": \"a castle\", \"negative\": \"blurry\"}\n```", "a castle", "blurry", true},
		{"cut after positive", `{"positive": "a castle", "negative": "blur`, "a castle", "", true},
		{"cut in positive", `{"negative": "blurry", "positive": "a cas`, "", "", false},
		{"trailing text", `{"positive": "a castle", "negative": "blurry"} hope this helps`, "a castle", "blurry", true},
		{"text format", "Positive: a castle\nNegative: blurry", "", "", false},
		{"preamble", `Here it is: {"positive": "a castle"}`, "", "", false},
		{"array", `[{"positive": "a castle"}]`, "", "", false},
		{"string", `"a castle"`, "", "", false},
		{"no positive", `{"prompt": "a castle", "negative": "blurry"}`, "", "", false},
		{"positive null", `{"positive": null, "negative": "blurry"}`, "", "", false},
		{"empty positive", `{"positive": "", "negative": "blurry"}`, "", "blurry", true},
		{"empty", "", "", "", false},
		{"brace only", "{", "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pos, neg, ok := parseDualJSON(tt.in)
			if pos != tt.pos || neg != tt.neg || ok != tt.ok {
				t.Errorf("parseDualJSON(%q)\n= %q, %q, %v\nwant %q, %q, %v", tt.in, pos, neg, ok, tt.pos, tt.neg, tt.ok)
			}
		})
	}
}

func TestReadDual(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		schema   bool
		pos, neg string
		f        DualFormat
	}{
		{"text", "Positive: a castle\nNegative: blurry", false, "a castle", "blurry", DualText},
		{"JSON without schema is text", `{"positive": "a castle"}`, false, `{"positive": "a castle"}`, "", DualText},
		{"schema, JSON", `{"positive": "a castle", "negative": "blurry"}`, true, "a castle", "blurry", DualJSON},
		{"schema, text reply", "**Positive:** a castle\n**Negative:** blurry", true, "a castle", "blurry", DualJSONAsText},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pos, neg, f := readDual(tt.in, tt.schema)
			if pos != tt.pos || neg != tt.neg || f != tt.f {
				t.Errorf("readDual = %q, %q, %v; want %q, %q, %v", pos, neg, f, tt.pos, tt.neg, tt.f)
			}
		})
	}
	for f, want := range map[DualFormat]string{DualText: "text", DualJSON: "json", DualJSONAsText: "json read as text", 0: "DualFormat(0)"} {
		if f.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(f), f.String(), want)
		}
	}
}

func FuzzParseDualJSON(f *testing.F) {
	for _, s := range []string{
		`{"positive": "a castle", "negative": "blurry"}`,
		`{"negative": "blurry", "positive": "a cas`,
		`{"positive": 1, "positive": "x", "a": {"b": [null, true]}}`,
		"```json\n{\"positive\": \"**Prompt:** x\"}\n```",
		"<think>{</think>{\"POSITIVE\": \"\\ud800\"}",
		`{"positive": "\"\""}`,
		"Positive: a\nNegative: b",
		"{",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pos, neg, ok := parseDualJSON(s)
		if !ok && (pos != "" || neg != "") {
			t.Fatalf("parseDualJSON(%q) failed with %q, %q", s, pos, neg)
		}
		for _, p := range []string{pos, neg} {
			if !utf8.ValidString(p) {
				t.Fatalf("invalid UTF-8 out: %q", p)
			}
			if again, _ := Clean(p, CleanOptions{}); again != p {
				t.Fatalf("part %q is not clean: %q", p, again)
			}
		}
		// Whatever the reply, readDual gives a clean positive and a format.
		p, _, fm := readDual(s, true)
		if (fm == DualJSON) != ok || (fm == DualJSON && p != pos) {
			t.Fatalf("readDual(%q) = %q, %v; parseDualJSON ok %v", s, p, fm, ok)
		}
	})
}
