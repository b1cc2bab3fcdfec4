package main

import (
	"bytes"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/vramguard/vramguard/nodes"
	"github.com/vramguard/vramguard/vramguardtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// script is a simulated model that answers every prompt with text and
// records the prompts it was sent.
type script struct {
	mu      sync.Mutex
	prompts []string
}

func (sc *script) model(name, text string) vramguardtest.ModelConfig {
	return vramguardtest.ModelConfig{Name: name, Respond: func(prompt string) []vramguardtest.Chunk {
		sc.mu.Lock()
		sc.prompts = append(sc.prompts, prompt)
		sc.mu.Unlock()
		var out []vramguardtest.Chunk
		for _, w := range strings.SplitAfter(text, " ") {
			out = append(out, vramguardtest.Chunk{Text: w})
		}
		return out
	}}
}

func (sc *script) sent() []string {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return append([]string(nil), sc.prompts...)
}

const refined = "a red fox in fresh snow, golden hour, shallow depth of field"

// invoke runs the command with args and stdin and returns its exit status,
// stdout and stderr.
func invoke(t *testing.T, args []string, stdin string, getenv func(string) string, tty bool) (code int, stdout, stderr string) {
	t.Helper()
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	var out, errOut bytes.Buffer
	c := &cmd{stdin: strings.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: getenv, tty: tty}
	code = c.main(t.Context(), args)
	return code, out.String(), errOut.String()
}

func TestRun(t *testing.T) {
	tests := []struct {
		name       string
		models     []string // the first answers with refined, the others with "other"
		args       []string // -host is added
		env        bool     // pass the host as OLLAMA_HOST instead of -host
		stdin      string
		model      string // the model that must have answered
		requests   int
		resident   bool
		wantPrompt string // a text the last request's prompt must contain
	}{
		{name: "args", models: []string{"writer"}, args: []string{"-model", "writer", "a", "fox"}, model: "writer", requests: 1, wantPrompt: "a fox"},
		{name: "stdin", models: []string{"writer"}, args: []string{"-model", "writer"}, stdin: "  a fox\n", model: "writer", requests: 1, wantPrompt: "a fox"},
		{name: "OLLAMA_HOST", models: []string{"writer"}, args: []string{"-model", "writer", "a fox"}, env: true, model: "writer", requests: 1},
		{name: "three passes", models: []string{"writer"}, args: []string{"-model", "writer", "-passes", "3", "a fox"}, model: "writer", requests: 3, wantPrompt: refined},
		{name: "keep", models: []string{"writer"}, args: []string{"-model", "writer", "-keep", "a fox"}, model: "writer", requests: 1, resident: true},
		{name: "default model is prompt-tuned", models: []string{"prompt-enhancer", "alpha", "zeta"}, args: []string{"a fox"}, model: "prompt-enhancer", requests: 1},
		{name: "default model by name", models: []string{"alpha", "zeta"}, args: []string{"a fox"}, model: "alpha", requests: 1},
		{name: "generate with style", models: []string{"writer"}, args: []string{"-model", "writer", "-generate", "-style", "anime", "-passes", "2", "a fox"}, model: "writer", requests: 3, wantPrompt: refined},
		{name: "instructions", models: []string{"writer"}, args: []string{"-model", "writer", "-instructions", "more snow", "a fox"}, model: "writer", requests: 1, wantPrompt: "more snow"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sc script
			var cfgs []vramguardtest.ModelConfig
			for i, m := range tt.models {
				text := refined
				if i > 0 {
					text = "other"
				}
				cfgs = append(cfgs, sc.model(m, text))
			}
			s := vramguardtest.New(vramguardtest.Config{Models: cfgs})
			t.Cleanup(s.Close)

			args, getenv := append([]string{"-host", s.URL().String()}, tt.args...), func(string) string { return "" }
			if tt.env {
				args = tt.args
				getenv = func(k string) string {
					if k == "OLLAMA_HOST" {
						return s.URL().String()
					}
					return ""
				}
			}
			code, stdout, stderr := invoke(t, args, tt.stdin, getenv, false)
			if code != 0 || stdout != refined+"\n" || stderr != "" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want 0, %q, nothing", code, stdout, stderr, refined+"\n")
			}
			// The simulator counts unload requests too; the script sees
			// only generations.
			if got := len(sc.sent()); got != tt.requests {
				t.Errorf("%d generations, want %d", got, tt.requests)
			}
			if got := s.Requests(tt.model); got == 0 || got != s.Requests("") {
				t.Errorf("%d requests for %s of %d in all; want all of them", got, tt.model, s.Requests(""))
			}
			if got := s.Listed(tt.model); got != tt.resident {
				t.Errorf("%s resident after the run: %v, want %v", tt.model, got, tt.resident)
			}
			if tt.requests > 1 && !tt.resident && s.Loads(tt.model) != 1 {
				t.Errorf("%d loads, want 1: the model must stay warm between passes", s.Loads(tt.model))
			}
			if ps := sc.sent(); tt.wantPrompt != "" && !strings.Contains(ps[len(ps)-1], tt.wantPrompt) {
				t.Errorf("last prompt sent %q does not contain %q", ps[len(ps)-1], tt.wantPrompt)
			}
		})
	}
}

func TestRunGenerateUsesStyle(t *testing.T) {
	var sc script
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{sc.model("writer", refined)}})
	t.Cleanup(s.Close)
	code, _, stderr := invoke(t, []string{"-host", s.URL().String(), "-model", "writer", "-generate", "-style", "cyberpunk", "a fox"}, "", nil, false)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	want, err := nodes.BuiltinStyles().Render("cyberpunk", nodes.TemplateData{Description: "a fox"})
	if err != nil {
		t.Fatal(err)
	}
	if ps := sc.sent(); len(ps) != 2 || ps[0] != want {
		t.Errorf("prompts sent %q; want the cyberpunk style's first, then a refinement", ps)
	}
}

func TestRunErrors(t *testing.T) {
	crash := vramguardtest.ModelConfig{Name: "crashy"}
	tests := []struct {
		name   string
		args   []string // -host of a simulator with "writer" and "crashy" is added
		stdin  string
		server string // "up" (default), "down" or "empty"
		code   int
		stderr string
	}{
		{name: "too many passes", args: []string{"-passes", "4", "a fox"}, code: 2, stderr: "invalid input: -passes 4: want 1 to 3"},
		{name: "no passes", args: []string{"-passes", "0", "a fox"}, code: 2, stderr: "invalid input"},
		{name: "style without generate", args: []string{"-style", "anime", "a fox"}, code: 2, stderr: "-style needs -generate"},
		{name: "unknown style", args: []string{"-generate", "-style", "baroque", "a fox"}, code: 2, stderr: `unknown style "baroque"`},
		{name: "unknown flag", args: []string{"-color", "a fox"}, code: 2, stderr: "flag provided but not defined: -color"},
		{name: "negative timeout", args: []string{"-timeout", "-1s", "a fox"}, code: 2, stderr: "invalid input"},
		{name: "empty stdin", args: []string{"-model", "writer"}, stdin: " \n", code: 2, stderr: "invalid input: empty prompt"},
		{name: "blank argument", args: []string{"-model", "writer", " "}, code: 2, stderr: "invalid input: empty prompt"},
		{name: "bad host", args: []string{"-host", "ftp://x", "a fox"}, code: 2, stderr: "invalid input"},
		{name: "unknown model", args: []string{"-model", "nope", "a fox"}, code: 1, stderr: "not found"},
		{name: "model crash", args: []string{"-model", "crashy", "a fox"}, code: 1, stderr: "model crash"},
		{name: "no server", args: []string{"a fox"}, server: "down", code: 1, stderr: "unavailable: no Ollama server answers at http://127.0.0.1:"},
		{name: "no models", args: []string{"a fox"}, server: "empty", code: 1, stderr: "not found: the server has no models installed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg vramguardtest.Config
			if tt.server != "empty" {
				cfg.Models = []vramguardtest.ModelConfig{(&script{}).model("writer", refined), crash}
			}
			s := vramguardtest.New(cfg)
			t.Cleanup(s.Close)
			if tt.server != "empty" {
				if err := s.SetFaults("crashy", vramguardtest.LoadCrash()); err != nil {
					t.Fatal(err)
				}
			}
			host := s.URL().String()
			if tt.server == "down" {
				s.Close()
			}
			code, stdout, stderr := invoke(t, append([]string{"-host", host}, tt.args...), tt.stdin, nil, false)
			if code != tt.code {
				t.Errorf("exit %d, want %d", code, tt.code)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if !strings.HasPrefix(stderr, "refine: ") || !strings.Contains(stderr, tt.stderr) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("stderr %q, want one line naming %q", stderr, tt.stderr)
			}
			if tt.server != "down" && s.Listed("crashy") {
				t.Error("crashy still listed")
			}
		})
	}
}

// TestHelp: -h, -help and --help print the usage on stderr and exit 0,
// with a prompt given or not (stdin is not read); a flag that is not one
// still exits 2 with one line.
func TestHelp(t *testing.T) {
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string // its start
	}{
		{name: "h", args: []string{"-h"}, stderr: "usage: refine [flags] [prompt ...]\n"},
		{name: "help", args: []string{"-help"}, stderr: "usage: refine [flags] [prompt ...]\n"},
		{name: "two dashes", args: []string{"--help"}, stderr: "usage: refine [flags] [prompt ...]\n"},
		{name: "after flags", args: []string{"-passes", "2", "--help", "a fox"}, stderr: "usage: refine [flags] [prompt ...]\n"},
		{name: "bad flag", args: []string{"-hlep", "a fox"}, code: 2, stderr: "refine: usage: invalid input: flag provided but not defined: -hlep (see refine -h)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := invoke(t, tt.args, "", nil, false)
			if code != tt.code || stdout != "" || !strings.HasPrefix(stderr, tt.stderr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %d, nothing, %q", code, stdout, stderr, tt.code, tt.stderr)
			}
			if tt.code != 0 {
				if strings.Count(stderr, "\n") != 1 {
					t.Errorf("stderr %q is not one line", stderr)
				}
				return
			}
			for _, f := range []string{"-host URL", "-model model", "-passes", "-generate"} {
				if !strings.Contains(stderr, "\n  "+f) {
					t.Errorf("usage %q does not list %s", stderr, f)
				}
			}
		})
	}
}

func TestProgress(t *testing.T) {
	tests := []struct {
		name string
		args []string
		tty  bool
		want []string // in stderr
	}{
		{name: "percentage", args: []string{"-max-tokens", "20", "-passes", "2"}, tty: true, want: []string{"\rrefine 1/2 [", "%", "\rrefine 2/2 [", "] 100% 24 tokens"}},
		{name: "spinner", args: []string{"-generate"}, tty: true, want: []string{"\rgenerate | 1 tokens", "\rgenerate / 2 tokens", "\rrefine ", "12 tokens"}},
		{name: "not a terminal", args: []string{"-passes", "2"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{(&script{}).model("writer", refined)}})
			t.Cleanup(s.Close)
			args := append([]string{"-host", s.URL().String(), "-model", "writer"}, append(tt.args, "a fox")...)
			code, stdout, stderr := invoke(t, args, "", nil, tt.tty)
			if code != 0 || stdout != refined+"\n" {
				t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
			}
			if !tt.tty {
				if stderr != "" {
					t.Errorf("stderr %q, want nothing when it is not a terminal", stderr)
				}
				return
			}
			for _, w := range tt.want {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr %q does not contain %q", stderr, w)
				}
			}
			if !strings.HasSuffix(stderr, "\r\x1b[K") {
				t.Errorf("stderr %q does not end by clearing the line", stderr)
			}
		})
	}
}
