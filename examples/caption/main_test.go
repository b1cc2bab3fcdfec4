package main

import (
	"bytes"
	"errors"
	"image"
	"image/png"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/vramguard/vramguard/vramguardtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const caption = "a red fox curled up in fresh snow, soft morning light"

// vision is a simulated vision model that answers every request with
// caption, a word per chunk.
func vision(name string) vramguardtest.ModelConfig {
	return vramguardtest.ModelConfig{Name: name, Vision: true, RespondTo: func(vramguardtest.Call) []vramguardtest.Chunk {
		var out []vramguardtest.Chunk
		for _, w := range strings.SplitAfter(caption, " ") {
			out = append(out, vramguardtest.Chunk{Text: w})
		}
		return out
	}}
}

// pngImage encodes a w×h picture.
func pngImage(t *testing.T, w, h int) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := png.Encode(&b, image.NewGray(image.Rect(0, 0, w, h))); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// writeFile writes data to a file in a temporary folder and returns its path.
func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// invoke runs the command with args and stdin and returns its exit status,
// stdout and stderr.
func invoke(t *testing.T, args []string, stdin []byte, getenv func(string) string, tty bool) (code int, stdout, stderr string) {
	t.Helper()
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	var out, errOut bytes.Buffer
	c := &cmd{stdin: bytes.NewReader(stdin), stdout: &out, stderr: &errOut, getenv: getenv, readFile: os.ReadFile, tty: tty}
	code = c.main(t.Context(), args)
	return code, out.String(), errOut.String()
}

func TestRun(t *testing.T) {
	img := pngImage(t, 16, 9)
	file := writeFile(t, "fox.png", img)
	tests := []struct {
		name     string
		models   []vramguardtest.ModelConfig
		args     []string // -host is added, unless env
		env      bool     // pass the host as OLLAMA_HOST instead of -host
		stdin    bool     // send the image on stdin
		model    string   // the model that must have answered
		keep     bool
		inSystem string // a text the system message must contain
		inUser   string // a text the user message must contain
	}{
		{name: "file", models: []vramguardtest.ModelConfig{vision("eyes")}, args: []string{"-model", "eyes", file}, model: "eyes", inSystem: "in the cinematic style"},
		{name: "stdin", models: []vramguardtest.ModelConfig{vision("eyes")}, args: []string{"-model", "eyes", "-"}, stdin: true, model: "eyes"},
		{name: "OLLAMA_HOST", models: []vramguardtest.ModelConfig{vision("eyes")}, args: []string{"-model", "eyes", file}, env: true, model: "eyes"},
		{name: "style, hint and mood", models: []vramguardtest.ModelConfig{vision("eyes")}, args: []string{"-model", "eyes", "-style", "Anime", "-hint", "a fox", "-mood", "calm", file},
			model: "eyes", inSystem: "in the anime style", inUser: "About the image: a fox"},
		{name: "keep", models: []vramguardtest.ModelConfig{vision("eyes")}, args: []string{"-model", "eyes", "-keep", file}, model: "eyes", keep: true},
		{name: "default model sees", models: []vramguardtest.ModelConfig{{Name: "alpha"}, vision("zeta"), vision("omega")}, args: []string{file}, model: "omega"},
		{name: "default model, prompt-tuned first", models: []vramguardtest.ModelConfig{vision("alpha"), vision("prompt-eyes")}, args: []string{file}, model: "prompt-eyes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := vramguardtest.New(vramguardtest.Config{Models: tt.models})
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
			var stdin []byte
			if tt.stdin {
				stdin = img
			}
			code, stdout, stderr := invoke(t, args, stdin, getenv, false)
			if code != 0 || stdout != caption+"\n" {
				t.Fatalf("exit %d, stdout %q, stderr %q; want 0, %q", code, stdout, stderr, caption+"\n")
			}
			// The unload report, one line on stderr.
			// The unload report, one line on stderr, names the model as
			// given or as the catalog lists it.
			line := strings.Replace(stderr, tt.model+":latest", tt.model, 1)
			wantErr := "caption: unloaded " + tt.model + ", verified (ps"
			if tt.keep {
				wantErr = "caption: left " + tt.model + " loaded (-keep)\n"
			}
			if !strings.HasPrefix(line, wantErr) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("stderr %q, want one line starting %q", stderr, wantErr)
			}
			if got := s.Listed(tt.model); got != tt.keep {
				t.Errorf("%s resident after the run: %v, want %v", tt.model, got, tt.keep)
			}
			var chats []vramguardtest.Call
			for _, c := range s.Calls("") {
				if c.Endpoint == "chat" {
					chats = append(chats, c)
				}
			}
			if len(chats) != 1 || strings.TrimSuffix(chats[0].Model, ":latest") != tt.model || len(chats[0].Messages) != 2 {
				t.Fatalf("%d chats (%+v); want one to %s with two messages", len(chats), s.Calls(""), tt.model)
			}
			sys, user := chats[0].Messages[0], chats[0].Messages[1]
			if len(user.Images) != 1 || !bytes.Equal(user.Images[0], img) {
				t.Errorf("the image did not arrive as sent")
			}
			if !strings.Contains(sys.Content, tt.inSystem) || !strings.Contains(user.Content, tt.inUser) {
				t.Errorf("messages:\n%s\n---\n%s\nwant %q in the first, %q in the second", sys.Content, user.Content, tt.inSystem, tt.inUser)
			}
		})
	}
}

// TestFallback: with no Ollama answering, the command says so on the first
// line of stderr and captions with the simulator, unload included.
func TestFallback(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{})
	host := s.URL().String()
	s.Close() // nothing answers there now
	code, stdout, stderr := invoke(t, []string{"-host", host, "-style", "anime", writeFile(t, "fox.png", pngImage(t, 16, 9))}, nil, nil, false)
	if code != 0 {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	lines := strings.Split(strings.TrimSuffix(stderr, "\n"), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "caption: no Ollama answered at "+host) || !strings.Contains(lines[0], "built-in simulator") {
		t.Fatalf("stderr %q; want the simulator named on the first line, then the unload", stderr)
	}
	if !strings.HasPrefix(lines[1], "caption: unloaded "+simModel+", verified (") {
		t.Errorf("second line %q; want the unload report", lines[1])
	}
	if want := "the subject of a 16x9 PNG image, anime style, "; !strings.HasPrefix(stdout, want) || strings.Count(stdout, "\n") != 1 {
		t.Errorf("stdout %q; want one line starting %q", stdout, want)
	}
}

func TestRunErrors(t *testing.T) {
	img := pngImage(t, 4, 4)
	good := writeFile(t, "fox.png", img)
	text := writeFile(t, "notes.txt", []byte("a fox in the snow\n"))
	empty := writeFile(t, "empty.png", nil)
	gif := writeFile(t, "fox.gif", []byte("GIF89a\x01\x00\x01\x00"))
	tests := []struct {
		name     string
		args     []string // -host of a simulator with "eyes" (vision) and "blind" is added
		stdin    []byte
		stdinTTY bool
		server   string // "up" (default), "down" or "no vision"
		code     int
		stderr   string
	}{
		{name: "text file", args: []string{"-model", "eyes", text}, code: 2, stderr: `invalid input: ` + text + `: image is not PNG, JPEG or WebP (it starts "a fox in")`},
		{name: "text on stdin", args: []string{"-model", "eyes", "-"}, stdin: []byte("a fox"), code: 2, stderr: "invalid input: stdin: image is not PNG, JPEG or WebP"},
		{name: "GIF", args: []string{"-model", "eyes", gif}, code: 2, stderr: "image is not PNG, JPEG or WebP"},
		{name: "empty file", args: []string{"-model", "eyes", empty}, code: 2, stderr: empty + ": image is not PNG, JPEG or WebP: the image is empty"},
		{name: "empty stdin", args: []string{"-model", "eyes", "-"}, code: 2, stderr: "stdin: image is not PNG, JPEG or WebP: the image is empty"},
		{name: "stdin too large", args: []string{"-model", "eyes", "-"}, stdin: append(bytes.Clone(img), make([]byte, 20<<20)...), code: 2, stderr: "image too large"},
		{name: "stdin is a terminal", args: []string{"-model", "eyes", "-"}, stdinTTY: true, code: 2, stderr: "stdin is a terminal"},
		{name: "missing file", args: []string{"-model", "eyes", "/nonexistent/fox.png"}, code: 2, stderr: "no such file or directory"},
		{name: "no argument", args: []string{"-model", "eyes"}, code: 2, stderr: "want one image file, or - for stdin; got 0 arguments"},
		{name: "two arguments", args: []string{"-model", "eyes", good, good}, code: 2, stderr: "got 2 arguments"},
		{name: "unknown style", args: []string{"-style", "baroque", good}, code: 2, stderr: `unknown style "baroque"`},
		{name: "unknown flag", args: []string{"-color", good}, code: 2, stderr: "flag provided but not defined: -color"},
		{name: "negative timeout", args: []string{"-timeout", "-1s", good}, code: 2, stderr: "-timeout -1s is negative"},
		{name: "seed out of range", args: []string{"-seed", "-1", good}, code: 2, stderr: "-seed -1"},
		{name: "bad host", args: []string{"-host", "ftp://x", good}, code: 2, stderr: "invalid input"},
		{name: "text model", args: []string{"-model", "blind", good}, code: 2, stderr: "cannot see images"},
		{name: "unknown model", args: []string{"-model", "nope", good}, code: 1, stderr: "not found"},
		{name: "no vision model installed", args: []string{good}, server: "no vision", code: 1, stderr: "not found: none of the 1 installed models lists vision"},
		{name: "no server, no simulator", args: []string{"-no-sim", good}, server: "down", code: 1, stderr: "unavailable: no Ollama server answers at http://127.0.0.1:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			models := []vramguardtest.ModelConfig{vision("eyes"), {Name: "blind"}}
			if tt.server == "no vision" {
				models = models[1:]
			}
			s := vramguardtest.New(vramguardtest.Config{Models: models})
			t.Cleanup(s.Close)
			host := s.URL().String()
			if tt.server == "down" {
				s.Close()
			}
			var out, errOut bytes.Buffer
			c := &cmd{stdin: bytes.NewReader(tt.stdin), stdout: &out, stderr: &errOut, getenv: func(string) string { return "" },
				readFile: os.ReadFile, stdinTTY: tt.stdinTTY}
			code := c.main(t.Context(), append([]string{"-host", host}, tt.args...))
			stdout, stderr := out.String(), errOut.String()
			if code != tt.code {
				t.Errorf("exit %d, want %d (stderr %q)", code, tt.code, stderr)
			}
			if stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			if !strings.HasPrefix(stderr, "caption: ") || !strings.Contains(stderr, tt.stderr) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("stderr %q, want one line naming %q", stderr, tt.stderr)
			}
			if tt.server != "down" {
				if ms := s.Running(); len(ms) != 0 {
					t.Errorf("models left: %+v", ms)
				}
				if n := s.Loads(""); n != 0 {
					t.Errorf("%d loads; the input was refused before any", n)
				}
			}
		})
	}
}

func TestImageErrors(t *testing.T) {
	c := &cmd{readFile: func(string) ([]byte, error) { return nil, fs.ErrPermission }}
	_, err := c.image("secret.png")
	if !errors.Is(err, fs.ErrPermission) {
		t.Errorf("error %v does not wrap the read's", err)
	}
}

// TestHelp: -h, -help and --help print the usage on stderr and exit 0,
// even with an image named; a flag that is not one still exits 2 with one
// line.
func TestHelp(t *testing.T) {
	img := writeFile(t, "fox.png", pngImage(t, 4, 4))
	tests := []struct {
		name   string
		args   []string
		code   int
		stderr string // its start
	}{
		{name: "h", args: []string{"-h"}, stderr: "usage: caption [flags] IMAGE|-\n"},
		{name: "help", args: []string{"-help"}, stderr: "usage: caption [flags] IMAGE|-\n"},
		{name: "two dashes", args: []string{"--help"}, stderr: "usage: caption [flags] IMAGE|-\n"},
		{name: "after flags", args: []string{"-style", "anime", "-h", img}, stderr: "usage: caption [flags] IMAGE|-\n"},
		{name: "bad flag", args: []string{"-hlep", img}, code: 2, stderr: "caption: usage: invalid input: flag provided but not defined: -hlep (see caption -h)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := invoke(t, tt.args, nil, nil, false)
			if code != tt.code || stdout != "" || !strings.HasPrefix(stderr, tt.stderr) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want %d, nothing, %q", code, stdout, stderr, tt.code, tt.stderr)
			}
			if tt.code != 0 {
				if strings.Count(stderr, "\n") != 1 {
					t.Errorf("stderr %q is not one line", stderr)
				}
				return
			}
			for _, f := range []string{"-host URL", "-model model", "-no-sim", "-seed"} {
				if !strings.Contains(stderr, "\n  "+f) {
					t.Errorf("usage %q does not list %s", stderr, f)
				}
			}
		})
	}
}

func TestProgress(t *testing.T) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{vision("eyes")}})
	t.Cleanup(s.Close)
	args := []string{"-host", s.URL().String(), "-model", "eyes", "-max-tokens", "20", writeFile(t, "fox.png", pngImage(t, 4, 4))}
	code, stdout, stderr := invoke(t, args, nil, nil, true)
	if code != 0 || stdout != caption+"\n" {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	for _, w := range []string{"\rcaption [", "%", "\r\x1b[K", "\x1b[Kcaption: unloaded eyes, verified"} {
		if !strings.Contains(stderr, w) {
			t.Errorf("stderr %q does not contain %q", stderr, w)
		}
	}
}
