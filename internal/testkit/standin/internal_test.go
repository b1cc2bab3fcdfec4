package standin

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		args string
		want options
	}{
		{"none", "", options{host: defaultHost, port: defaultPort}},
		{"ollama load", "--model /b/sha256-x --port 4000 --host 127.0.0.1 --no-webui --offline -c 512 -np 2 --log-verbosity 4 --no-log-prefix --no-log-timestamps --load-mode none --flash-attn auto -b 512 -ub 512 --context-shift --keep 4",
			options{model: "/b/sha256-x", host: "127.0.0.1", port: 4000, ctxSize: 512, parallel: 2, contextShift: true}},
		{"ollama discovery", "--port 50000 --host 127.0.0.1 --no-webui --offline --verbose",
			options{host: "127.0.0.1", port: 50000}},
		{"list devices", "--list-devices --offline --verbose", options{host: defaultHost, port: defaultPort, listDevices: true}},
		{"unknown flags with values", "--frob 7 -Z --weird -1 --model m -q x -c 64",
			options{model: "m", host: defaultHost, port: defaultPort, ctxSize: 64}},
		{"unknown flag before a short flag", "--switch -c 9 --other --port 1",
			options{host: defaultHost, port: 1, ctxSize: 9}},
		{"equals form", "--model=/m --ctx-size=100 --unknown=-c --port=7",
			options{model: "/m", host: defaultHost, port: 7, ctxSize: 100}},
		{"value flag takes a dash value", "--keep -1 --model m", options{model: "m", host: defaultHost, port: defaultPort}},
		{"stray values", "stray -1 --model m more", options{model: "m", host: defaultHost, port: defaultPort}},
		{"last wins, no-context-shift", "-m a --model b --context-shift --no-context-shift",
			options{model: "b", host: defaultHost, port: defaultPort}},
		{"bad numbers", "--port x -c -5 --port 70000",
			options{host: defaultHost, port: defaultPort, bad: []string{"--port x", "-c -5", "--port 70000"}}},
		{"flag at the end", "--model", options{host: defaultHost, port: defaultPort}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseArgs(strings.Fields(tc.args))
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("parseArgs(%q)\n got %+v\nwant %+v", tc.args, got, tc.want)
			}
		})
	}
}

func FuzzParseArgs(f *testing.F) {
	f.Add("--model m --port 1 -c 5 --frob -1 --x=y")
	f.Add("-- - -- --=")
	f.Fuzz(func(t *testing.T, s string) {
		o := parseArgs(strings.Split(s, " "))
		if o.port < 0 || o.port > 65535 || o.slotCtx() < 1 || o.slots() < 1 {
			t.Fatalf("parseArgs(%q) = %+v", s, o)
		}
	})
}

func TestTokenizeRoundTrip(t *testing.T) {
	for _, s := range []string{"", "a", "héllo wörld", "\x00\xff<s>"} {
		ids := tokenize(s, true)
		if len(ids) != len(s)+1 || ids[0] != tokenBOS {
			t.Fatalf("tokenize(%q) = %v", s, ids)
		}
		if got := detokenize(ids[1:]); got != s {
			t.Fatalf("detokenize(tokenize(%q)) = %q", s, got)
		}
	}
	if got := detokenize([]int{tokenUnk, tokenBOS, tokenEOS, -1, vocabSize}); got != "<unk><s></s>" {
		t.Fatalf("special and unknown tokens: %q", got)
	}
}

func FuzzPromptTokens(f *testing.F) {
	for _, s := range []string{`"hi"`, `[1,2,"x"]`, `[[]]`, `[[4,5]]`, `{"prompt_string":"a"}`, `{}`, `null`, `[{"a":1}]`, `3`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		ids, err := promptTokens(b)
		var s string
		if err == nil && json.Unmarshal(b, &s) == nil && utf8.ValidString(s) {
			if got := detokenize(ids); got != "<s>"+s {
				t.Fatalf("string prompt %q came back as %q", s, got)
			}
		}
	})
}

func TestKnobsForModel(t *testing.T) {
	k := Knobs{
		LoadMS: 5, TokenMS: 6, Hang: HangCompletion,
		Models: map[string]Knobs{
			"abc":    {TokenMS: 1, OOMAtLoad: true},
			"abcdef": {LoadMS: 9, DeviceBytes: 1 << 30},
			"zzz":    {ExitAtLoad: true},
		},
	}
	for _, tc := range []struct {
		path string
		want Knobs
	}{
		{"/blobs/sha256-abcdef01", Knobs{LoadMS: 9, TokenMS: 6, Hang: HangCompletion, DeviceBytes: 1 << 30}},
		{"/blobs/sha256-abc999", Knobs{LoadMS: 5, TokenMS: 1, Hang: HangCompletion, OOMAtLoad: true}},
		{"/blobs/sha256-000", Knobs{LoadMS: 5, TokenMS: 6, Hang: HangCompletion}},
		{"", Knobs{LoadMS: 5, TokenMS: 6, Hang: HangCompletion}},
	} {
		if got := k.ForModel(tc.path); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ForModel(%q) = %+v, want %+v", tc.path, got, tc.want)
		}
	}
}

func TestKnobDefaults(t *testing.T) {
	var k Knobs
	if k.loadDelay().Milliseconds() != DefaultLoadMS || k.tokenDelay().Milliseconds() != DefaultTokenMS || k.eosAfter() != DefaultEOSAfter {
		t.Fatalf("zero knobs: %v %v %v", k.loadDelay(), k.tokenDelay(), k.eosAfter())
	}
	k = Knobs{LoadMS: -1, TokenMS: -5, EOSAfter: 3}
	if k.loadDelay() != 0 || k.tokenDelay() != 0 || k.eosAfter() != 3 {
		t.Fatalf("negative knobs: %v %v %v", k.loadDelay(), k.tokenDelay(), k.eosAfter())
	}
}

func TestReadWriteKnobs(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "k.json")
	if k, err := ReadKnobs(path); err != nil || !reflect.DeepEqual(k, Knobs{}) {
		t.Fatalf("missing file: %+v, %v", k, err)
	}
	if k, err := ReadKnobs(""); err != nil || !reflect.DeepEqual(k, Knobs{}) {
		t.Fatalf("no path: %+v, %v", k, err)
	}
	want := Knobs{LoadMS: 1, TokenMS: 2, EOSAfter: 3, CrashAfterTokens: 4, OOMAtLoad: true, OOMHealth: true,
		ExitAtLoad: true, Hang: HangLoad, ModelBytes: 5, DeviceBytes: 6, Models: map[string]Knobs{"x": {TokenMS: 7}}}
	if err := WriteKnobs(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := ReadKnobs(path)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	b, _ := os.ReadFile(path)
	for _, field := range []string{"load_ms", "token_ms", "eos_after", "crash_after_tokens", "oom_at_load", "oom_health", "exit_at_load", "hang", "model_bytes", "device_bytes", "models"} {
		if !strings.Contains(string(b), `"`+field+`"`) {
			t.Errorf("file lacks %q:\n%s", field, b)
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("temporary files left: %v", entries)
	}

	for _, bad := range []Knobs{{Hang: "forever"}, {EOSAfter: -1}, {DeviceBytes: -1}, {Models: map[string]Knobs{"": {}}}, {Models: map[string]Knobs{"m": {Hang: "x"}}}} {
		if err := WriteKnobs(path, bad); err == nil {
			t.Errorf("WriteKnobs(%+v) accepted invalid knobs", bad)
		}
	}
	for _, bad := range []string{`{"load_ms": "x"}`, `{"typo_ms": 1}`, `{"hang": "soon"}`, `{} {}`, `[`} {
		if _, err := parseKnobs([]byte(bad)); err == nil {
			t.Errorf("parseKnobs(%s) accepted it", bad)
		}
	}
}

func FuzzParseKnobs(f *testing.F) {
	f.Add([]byte(`{"load_ms":1,"hang":"load","models":{"a":{"token_ms":2}}}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, b []byte) {
		k, err := parseKnobs(b)
		if err == nil && k.Validate() != nil {
			t.Fatalf("parseKnobs accepted invalid knobs %+v", k)
		}
	})
}

func TestReadEventsPartialLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ev.jsonl")
	content := `{"event":"start","pid":1,"args":["--model","/m"]}` + "\n" + `{"event":"requ`
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	ev, err := ReadEvents(path)
	if err != nil || len(ev) != 1 || ev[0].Model() != "/m" {
		t.Fatalf("%+v, %v", ev, err)
	}
	if err := os.WriteFile(path, []byte("garbage\n"+content), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadEvents(path); err == nil {
		t.Fatal("a broken complete line was accepted")
	}
	if ev, err := ReadEvents(filepath.Join(t.TempDir(), "none")); err != nil || ev != nil {
		t.Fatalf("missing file: %v, %v", ev, err)
	}
}

func TestPlan(t *testing.T) {
	r := &runner{opts: options{ctxSize: 20}}
	for _, tc := range []struct {
		name     string
		prompt   int
		nPredict int
		shift    bool
		limit    int
		stopType string
		err      bool
	}{
		{"n_predict", 5, 3, false, 3, "limit", false},
		{"eos", 5, -1, false, 10, "eos", false},
		{"eos before n_predict", 5, 11, false, 10, "eos", false},
		{"context full", 15, -1, false, 5, "limit", false},
		{"context shift", 15, -1, true, 10, "eos", false},
		{"prompt fills context", 20, 1, true, 0, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r.opts.contextShift = tc.shift
			p, e := r.plan(Knobs{EOSAfter: 10}, make([]int, tc.prompt), tc.nPredict, 0, nil, nil)
			if (e != nil) != tc.err || (e == nil && (p.limit != tc.limit || p.stopType != tc.stopType)) {
				t.Fatalf("plan = %+v, %v; want limit %d %q, error %v", p, e, tc.limit, tc.stopType, tc.err)
			}
		})
	}
}
