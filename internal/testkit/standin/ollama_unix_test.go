//go:build unix

package standin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/internal/testkit/gguf"
	"github.com/vramguard/vramguard/internal/testkit/standin"
)

// envOllamaBin names the Ollama v0.34.4 binary TestRealOllama runs; unset
// means the cache path scripts/install-ollama.sh builds into.
const envOllamaBin = "VRAMGUARD_OLLAMA_BIN"

func ollamaBinary(t *testing.T) string {
	t.Helper()
	path := os.Getenv(envOllamaBin)
	if path == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			t.Skipf("no home folder for the default Ollama path: %v", err)
		}
		path = filepath.Join(home, ".cache", "vramguard", "ollama", "0.34.4", "ollama")
	}
	if fi, err := os.Stat(path); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		if ci, _ := strconv.ParseBool(os.Getenv("CI")); ci {
			t.Fatalf("ollama v0.34.4 binary %s unavailable (CI=true makes this a failure): %v", path, err)
		}
		t.Skipf("ollama v0.34.4 binary %s unavailable (%v); build it with scripts/install-ollama.sh or set %s", path, err, envOllamaBin)
	}
	return path
}

// ollamaServer is a real `ollama serve` whose models run in the stand-in.
type ollamaServer struct {
	dir, knobs, events, logPath string
	client                      *api.Client
	base                        *url.URL
}

func startOllama(t *testing.T, bin string) *ollamaServer {
	t.Helper()
	dir := t.TempDir()
	s := &ollamaServer{
		dir:     dir,
		knobs:   filepath.Join(dir, "knobs.json"),
		events:  filepath.Join(dir, "events.jsonl"),
		logPath: filepath.Join(dir, "serve.log"),
	}
	// Ollama v0.34.4 finds llama-server in <working dir>/build/lib/ollama.
	libDir := filepath.Join(dir, "build", "lib", "ollama")
	if err := os.MkdirAll(libDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(standinBinary(t), filepath.Join(libDir, "llama-server")); err != nil {
		t.Fatal(err)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	host := ln.Addr().String()
	ln.Close()

	logf, err := os.Create(s.logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve")
	cmd.Dir = dir
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OLLAMA_") && !strings.HasPrefix(kv, "VRAMGUARD_STANDIN_") && !strings.HasPrefix(kv, "HOME=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env,
		"HOME="+filepath.Join(dir, "home"),
		"OLLAMA_HOST="+host,
		"OLLAMA_MODELS="+filepath.Join(dir, "models"),
		standin.EnvControl+"="+s.knobs,
		standin.EnvLog+"="+s.events,
	)
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, which its llama-server children inherit, so
	// that one kill ends them all.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	tr := &http.Transport{Proxy: nil}
	t.Cleanup(func() {
		tr.CloseIdleConnections()
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		logf.Close()
		if t.Failed() {
			if b, err := os.ReadFile(s.logPath); err == nil {
				t.Logf("ollama serve log (tail):\n%s", tail(string(b), 6000))
			}
		}
	})
	s.base = &url.URL{Scheme: "http", Host: host}
	s.client = api.NewClient(s.base, &http.Client{Transport: tr})

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for s.client.Heartbeat(ctx) != nil {
		select {
		case <-ctx.Done():
			t.Fatalf("ollama serve did not answer within 60s")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return s
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func (s *ollamaServer) setKnobs(t *testing.T, k standin.Knobs) {
	t.Helper()
	if err := standin.WriteKnobs(s.knobs, k); err != nil {
		t.Fatal(err)
	}
}

func (s *ollamaServer) readEvents(t *testing.T) []standin.Event {
	t.Helper()
	ev, err := standin.ReadEvents(s.events)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func (s *ollamaServer) serveLog(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// generation is what a streamed /api/generate delivered.
type generation struct {
	tokens []string // responses of the chunks before the final one
	final  *api.GenerateResponse
	err    error
}

func (s *ollamaServer) generate(ctx context.Context, req *api.GenerateRequest) generation {
	var g generation
	g.err = s.client.Generate(ctx, req, func(r api.GenerateResponse) error {
		if r.Done {
			g.final = &r
		} else if r.Response != "" {
			g.tokens = append(g.tokens, r.Response)
		}
		return nil
	})
	return g
}

// describe renders an error as status code and message where it has them.
func describe(err error) string {
	var se api.StatusError
	if errors.As(err, &se) {
		return fmt.Sprintf("HTTP %d %q (api.StatusError, Status %q)", se.StatusCode, se.ErrorMessage, se.Status)
	}
	if err == nil {
		return "no error"
	}
	return fmt.Sprintf("%q (%T)", err.Error(), err)
}

// unload unloads model and waits until /api/ps no longer lists it.
func (s *ollamaServer) unload(ctx context.Context, t *testing.T, model string) {
	t.Helper()
	zero := api.Duration{Duration: 0}
	g := s.generate(ctx, &api.GenerateRequest{Model: model, KeepAlive: &zero})
	if g.err != nil || g.final == nil || g.final.DoneReason != "unload" {
		t.Fatalf("unload %s: final %+v, error %s", model, g.final, describe(g.err))
	}
	for {
		ps, err := s.client.ListRunning(ctx)
		if err != nil {
			t.Fatalf("ps: %v", err)
		}
		if len(ps.Models) == 0 {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s still listed by /api/ps after the unload: %+v", model, ps.Models)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// modelStarts returns the argv of every stand-in started with --model.
func modelStarts(ev []standin.Event) [][]string {
	var out [][]string
	for _, e := range ev {
		if e.Event == standin.EventStart && e.Model() != "" {
			out = append(out, e.Args)
		}
	}
	return out
}

// TestRealOllama runs the real Ollama v0.34.4 server over the stand-in:
// its scheduler loads, runs and unloads a tiny model in the stand-in, and
// each failure knob gives the error text Ollama's own code makes of it.
// The texts and argv are logged (go test -v) for the project's notes.
func TestRealOllama(t *testing.T) {
	bin := ollamaBinary(t)
	s := startOllama(t, bin)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	const model = "tiny-a"
	digest, err := gguf.Register(ctx, s.client, model, gguf.Small())
	if err != nil {
		t.Fatalf("register: %v", err)
	}
	fileSize, err := gguf.Size(gguf.Small())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("registered %s: blob %s, %d bytes", model, digest, fileSize)
	s.setKnobs(t, standin.Knobs{})

	step := func(name string, f func(t *testing.T)) {
		if !t.Run(name, f) {
			t.FailNow() // later steps depend on the server's state
		}
	}

	step("generate", func(t *testing.T) {
		g := s.generate(ctx, &api.GenerateRequest{Model: model, Prompt: "hello", Options: map[string]any{"num_predict": 5}})
		if g.err != nil || g.final == nil {
			t.Fatalf("generate: final %v, error %s", g.final, describe(g.err))
		}
		if len(g.tokens) != 5 || g.final.DoneReason != "length" || g.final.EvalCount != 5 {
			t.Fatalf("got %d tokens %q, done_reason %q, eval_count %d; want 5, \"length\", 5", len(g.tokens), g.tokens, g.final.DoneReason, g.final.EvalCount)
		}
		// The same request again: the same text (the stand-in is deterministic).
		again := s.generate(ctx, &api.GenerateRequest{Model: model, Prompt: "hello", Options: map[string]any{"num_predict": 5}})
		if !slices.Equal(again.tokens, g.tokens) {
			t.Errorf("same request, different text: %q then %q", g.tokens, again.tokens)
		}
	})

	step("ps", func(t *testing.T) {
		ps, err := s.client.ListRunning(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(ps.Models) != 1 || ps.Models[0].Name != model+":latest" {
			t.Fatalf("ps lists %+v, want only %s:latest", ps.Models, model)
		}
		// Ollama parses "CPU model buffer size = %.2f MiB" back to bytes.
		mib, _ := strconv.ParseFloat(fmt.Sprintf("%.2f", float64(fileSize)/(1<<20)), 64)
		want := int64(mib * 1024 * 1024)
		if m := ps.Models[0]; m.Size != want || m.SizeVRAM != 0 {
			t.Fatalf("ps size %d (vram %d), want %d (the model file, %d bytes, as the buffer-size line states it) and 0", m.Size, m.SizeVRAM, want, fileSize)
		}
		t.Logf("/api/ps: %+v", ps.Models[0])
	})

	step("unload", func(t *testing.T) {
		s.unload(ctx, t, model)
	})

	step("model_bytes", func(t *testing.T) {
		s.setKnobs(t, standin.Knobs{ModelBytes: 5 << 20})
		defer s.setKnobs(t, standin.Knobs{})
		g := s.generate(ctx, &api.GenerateRequest{Model: model, Prompt: "size", Options: map[string]any{"num_predict": 1}})
		if g.err != nil {
			t.Fatalf("generate: %s", describe(g.err))
		}
		ps, err := s.client.ListRunning(ctx)
		if err != nil || len(ps.Models) != 1 {
			t.Fatalf("ps: %+v, %v", ps, err)
		}
		if ps.Models[0].Size != 5<<20 {
			t.Fatalf("ps size %d, want model_bytes %d", ps.Models[0].Size, 5<<20)
		}
		s.unload(ctx, t, model)
	})

	step("default_length", func(t *testing.T) {
		g := s.generate(ctx, &api.GenerateRequest{Model: model, Prompt: "on and on"})
		if g.err != nil || g.final == nil {
			t.Fatalf("generate: %s", describe(g.err))
		}
		if len(g.tokens) != standin.DefaultEOSAfter || g.final.DoneReason != "stop" {
			t.Fatalf("got %d tokens, done_reason %q; want %d and \"stop\"", len(g.tokens), g.final.DoneReason, standin.DefaultEOSAfter)
		}
	})

	step("chat", func(t *testing.T) {
		var content []string
		var final *api.ChatResponse
		err := s.client.Chat(ctx, &api.ChatRequest{
			Model:    model,
			Messages: []api.Message{{Role: "user", Content: "hi there"}},
			Options:  map[string]any{"num_predict": 4},
		}, func(r api.ChatResponse) error {
			if r.Done {
				final = &r
			} else if r.Message.Content != "" {
				content = append(content, r.Message.Content)
			}
			return nil
		})
		if err != nil || final == nil {
			t.Fatalf("chat: final %v, error %s", final, describe(err))
		}
		if len(content) != 4 || final.DoneReason != "length" || final.EvalCount != 4 {
			t.Fatalf("chat: %d chunks %q, done_reason %q, eval_count %d; want 4, \"length\", 4", len(content), content, final.DoneReason, final.EvalCount)
		}
	})

	step("chat_history", func(t *testing.T) {
		// More than one message: Ollama renders them with /apply-template
		// and counts them with /tokenize to drop what does not fit.
		var final *api.ChatResponse
		err := s.client.Chat(ctx, &api.ChatRequest{
			Model: model,
			Messages: []api.Message{
				{Role: "system", Content: "be brief"},
				{Role: "user", Content: "first"},
				{Role: "assistant", Content: "ok"},
				{Role: "user", Content: "second"},
			},
		}, func(r api.ChatResponse) error {
			if r.Done {
				final = &r
			}
			return nil
		})
		if err != nil || final == nil || final.DoneReason != "stop" || final.EvalCount != standin.DefaultEOSAfter {
			t.Fatalf("chat: final %+v, error %s; want done_reason \"stop\" after %d tokens", final, describe(err), standin.DefaultEOSAfter)
		}
	})

	step("cli_run", func(t *testing.T) {
		// With stdin not a terminal, `ollama run` sends the prompt through
		// /api/generate (cmd.generate); only the interactive REPL uses
		// /api/chat, which the chat steps cover.
		cctx, ccancel := context.WithTimeout(ctx, 60*time.Second)
		defer ccancel()
		cmd := exec.CommandContext(cctx, bin, "run", model, "--nowordwrap", "--keepalive", "0s")
		cmd.Env = append(os.Environ(), "OLLAMA_HOST="+s.base.Host, "HOME="+filepath.Join(s.dir, "home"))
		cmd.Stdin = strings.NewReader("say something\n")
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		words := strings.Fields(string(out))
		t.Logf("ollama run: %d words, err %v", len(words), err)
		if err != nil || len(words) != standin.DefaultEOSAfter {
			t.Fatalf("ollama run: %v, stdout %q, stderr %q; want %d words", err, out, tail(stderr.String(), 2000), standin.DefaultEOSAfter)
		}
		s.unload(ctx, t, model)
	})

	step("crash_after_tokens", func(t *testing.T) {
		s.setKnobs(t, standin.Knobs{CrashAfterTokens: 3})
		defer s.setKnobs(t, standin.Knobs{})
		g := s.generate(ctx, &api.GenerateRequest{Model: model, Prompt: "crash", Options: map[string]any{"num_predict": 10}})
		t.Logf("crash_after_tokens=3 through Ollama: %d tokens, then %s", len(g.tokens), describe(g.err))
		if g.err == nil || g.final != nil {
			t.Fatalf("want an error after 3 tokens, got final %+v", g.final)
		}
		if len(g.tokens) != 3 {
			t.Errorf("got %d tokens before the error, want 3", len(g.tokens))
		}
		if msg := g.err.Error(); !strings.Contains(msg, "llama-server process") && !strings.Contains(msg, "an error was encountered while running the model") {
			t.Errorf("error %q names neither the process nor a model error", msg)
		}
		ps, err := s.client.ListRunning(ctx)
		t.Logf("/api/ps right after the crash: %+v (err %v)", ps, err)
	})

	step("reload_after_crash", func(t *testing.T) {
		g := s.generate(ctx, &api.GenerateRequest{Model: model, Prompt: "again", Options: map[string]any{"num_predict": 2}})
		if g.err != nil || len(g.tokens) != 2 {
			t.Fatalf("after the crash: %d tokens, %s", len(g.tokens), describe(g.err))
		}
		s.unload(ctx, t, model)
	})

	loadFailure := func(name string, k standin.Knobs, want string) {
		step(name, func(t *testing.T) {
			before := len(modelStarts(s.readEvents(t)))
			s.setKnobs(t, k)
			defer s.setKnobs(t, standin.Knobs{})
			g := s.generate(ctx, &api.GenerateRequest{Model: model, Prompt: "load", Options: map[string]any{"num_predict": 1}})
			starts := len(modelStarts(s.readEvents(t))) - before
			t.Logf("%s through Ollama (%d runner starts): %s", name, starts, describe(g.err))
			if g.err == nil {
				t.Fatalf("want an error, got %d tokens", len(g.tokens))
			}
			if !strings.Contains(g.err.Error(), want) {
				t.Fatalf("error %q does not contain %q", g.err, want)
			}
		})
	}
	loadFailure("oom_at_load", standin.Knobs{OOMAtLoad: true}, "out of memory")
	loadFailure("oom_health", standin.Knobs{OOMAtLoad: true, OOMHealth: true}, "llama-server reported out-of-memory during startup")
	loadFailure("exit_at_load", standin.Knobs{ExitAtLoad: true}, "llama-server process has terminated")

	step("hang_completion", func(t *testing.T) {
		s.setKnobs(t, standin.Knobs{Hang: standin.HangCompletion})
		defer s.setKnobs(t, standin.Knobs{})
		hctx, hcancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer hcancel()
		g := s.generate(hctx, &api.GenerateRequest{Model: model, Prompt: "wait", Options: map[string]any{"num_predict": 3}})
		t.Logf("hang=completion, client gives up after 1.5s: %d tokens, %s", len(g.tokens), describe(g.err))
		if g.final != nil || len(g.tokens) != 0 {
			t.Fatalf("a hung completion produced output: %d tokens, final %+v", len(g.tokens), g.final)
		}
		// The runner sees the client go away (Ollama cancels its request).
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(s.serveLog(t), "cancel_tasks: cancel task") {
			if time.Now().After(deadline) {
				t.Fatal("the stand-in never saw the hung request cancelled")
			}
			time.Sleep(20 * time.Millisecond)
		}
		s.unload(ctx, t, model)
	})

	step("hang_load", func(t *testing.T) {
		s.setKnobs(t, standin.Knobs{Hang: standin.HangLoad})
		defer s.setKnobs(t, standin.Knobs{})
		hctx, hcancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer hcancel()
		g := s.generate(hctx, &api.GenerateRequest{Model: model, Prompt: "wait", Options: map[string]any{"num_predict": 1}})
		t.Logf("hang=load, client gives up after 1.5s: %s", describe(g.err))
		if g.err == nil {
			t.Fatal("a hung load answered")
		}
		deadline := time.Now().Add(10 * time.Second)
		for !strings.Contains(s.serveLog(t), "aborting load") {
			if time.Now().After(deadline) {
				t.Fatal("ollama did not abort the hung load")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})

	step("context_length", func(t *testing.T) {
		long := strings.Repeat("a", 400) // 400 tokens; the model's context is 256
		no := false
		g := s.generate(ctx, &api.GenerateRequest{Model: model, Prompt: long, Truncate: &no, Options: map[string]any{"num_predict": 1}})
		t.Logf("generate, 400-token prompt, truncate false: %s", describe(g.err))
		if g.err == nil {
			t.Errorf("a prompt longer than the context was accepted")
		}
		g = s.generate(ctx, &api.GenerateRequest{Model: model, Prompt: long, Options: map[string]any{"num_predict": 1}})
		t.Logf("generate, 400-token prompt, truncate default: %d tokens, %s", len(g.tokens), describe(g.err))
		_, err := s.client.Embed(ctx, &api.EmbedRequest{Model: model, Input: long, Truncate: &no})
		t.Logf("embed, 400-token input, truncate false: %s", describe(err))
		var se api.StatusError
		if !errors.As(err, &se) || se.StatusCode != http.StatusBadRequest || se.ErrorMessage != "the input length exceeds the context length" {
			t.Errorf("embed: got %s, want HTTP 400 \"the input length exceeds the context length\"", describe(err))
		}
		res, err := s.client.Embed(ctx, &api.EmbedRequest{Model: model, Input: "short"})
		if err != nil || len(res.Embeddings) != 1 || len(res.Embeddings[0]) == 0 {
			t.Errorf("embed short input: %+v, %s", res, describe(err))
		}
		// The default truncate cuts the input with /tokenize and /detokenize.
		res, err = s.client.Embed(ctx, &api.EmbedRequest{Model: model, Input: long})
		if err != nil || len(res.Embeddings) != 1 || res.PromptEvalCount >= 256 {
			t.Errorf("embed long input, truncated: %+v, %s", res, describe(err))
		}
		s.unload(ctx, t, model)
	})

	step("argv_and_paths", func(t *testing.T) {
		ev := s.readEvents(t)
		var discovery, listDevices, load []string
		var nDiscovery, nListDevices, nLoad int
		paths := map[string]int{}
		for _, e := range ev {
			switch {
			case e.Event == standin.EventStart && slices.Contains(e.Args, "--list-devices"):
				listDevices = e.Args
				nListDevices++
			case e.Event == standin.EventStart && e.Model() == "":
				discovery = e.Args
				nDiscovery++
			case e.Event == standin.EventStart:
				if load == nil {
					load = e.Args
				}
				nLoad++
			case e.Event == standin.EventRequest:
				paths[e.Method+" "+e.Path]++
			}
		}
		t.Logf("discovery argv (%d starts): %q", nDiscovery, discovery)
		t.Logf("--list-devices argv (%d runs): %q", nListDevices, listDevices)
		t.Logf("model load argv (first of %d starts): %q", nLoad, load)
		t.Logf("requests by path: %v", paths)
		if discovery == nil || listDevices == nil || load == nil {
			t.Fatalf("missing a start: discovery %q, list-devices %q, load %q", discovery, listDevices, load)
		}
		if !slices.Contains(load, "-c") || !slices.Contains(load, "--port") {
			t.Errorf("load argv lacks -c or --port: %q", load)
		}
		for _, p := range []string{"GET /health", "POST /completion", "POST /tokenize", "POST /v1/chat/completions", "POST /apply-template", "POST /v1/embeddings", "POST /detokenize"} {
			if paths[p] == 0 {
				t.Errorf("Ollama never called %s", p)
			}
		}
	})
}

// chatResult is what a streamed /api/chat delivered.
type chatResult struct {
	chunks []string // contents of the chunks before the final one
	final  *api.ChatResponse
	err    error
}

func (s *ollamaServer) chat(ctx context.Context, req *api.ChatRequest) chatResult {
	var c chatResult
	c.err = s.client.Chat(ctx, req, func(r api.ChatResponse) error {
		if r.Done {
			c.final = &r
		} else if r.Message.Content != "" {
			c.chunks = append(c.chunks, r.Message.Content)
		}
		return nil
	})
	return c
}

// lastRequest returns the body of the last request to path in the
// stand-in's event log, failing the test if there is none.
func (s *ollamaServer) lastRequest(t *testing.T, path string) map[string]any {
	t.Helper()
	ev := s.readEvents(t)
	for i := len(ev) - 1; i >= 0; i-- {
		if e := ev[i]; e.Event == standin.EventRequest && e.Path == path {
			var body map[string]any
			if err := json.Unmarshal(e.Body, &body); err != nil {
				t.Fatalf("%s body %s: %v", path, e.Body, err)
			}
			return body
		}
	}
	t.Fatalf("the stand-in never received %s", path)
	return nil
}

// TestRealOllamaChat runs /api/chat and structured output through the real
// Ollama v0.34.4 server: chat reaches the stand-in's
// /v1/chat/completions with the messages and streams back to done:true,
// and a JSON-schema format reaches the runner (response_format for chat,
// json_schema for /api/generate), whose answer then is an instance of the
// schema, as llama-server's grammar would make it.
func TestRealOllamaChat(t *testing.T) {
	bin := ollamaBinary(t)
	s := startOllama(t, bin)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	const model = "tiny-a"
	if _, err := gguf.Register(ctx, s.client, model, gguf.Small()); err != nil {
		t.Fatalf("register: %v", err)
	}
	s.setKnobs(t, standin.Knobs{})

	messages := []api.Message{{Role: "system", Content: "be terse"}, {Role: "user", Content: "describe a cat"}}
	schema := json.RawMessage(`{"type":"object","properties":{"positive":{"type":"string"},"negative":{"type":"string"}},"required":["positive","negative"]}`)
	wantInstance := func(t *testing.T, got string) {
		t.Helper()
		var v map[string]any
		if err := json.Unmarshal([]byte(got), &v); err != nil {
			t.Fatalf("answer %q is not JSON: %v", got, err)
		}
		if p, _ := v["positive"].(string); p == "" || len(v) != 2 {
			t.Fatalf("answer %q is not an instance of the schema", got)
		}
		if n, _ := v["negative"].(string); n == "" {
			t.Fatalf("answer %q is not an instance of the schema", got)
		}
	}
	wantSchema := func(t *testing.T, got any) {
		t.Helper()
		var want any
		if err := json.Unmarshal(schema, &want); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("the runner received schema %v, want %s", got, schema)
		}
	}

	t.Run("chat", func(t *testing.T) {
		c := s.chat(ctx, &api.ChatRequest{Model: model, Messages: messages, Options: map[string]any{"num_predict": 6}})
		if c.err != nil || c.final == nil {
			t.Fatalf("chat: final %v, error %s", c.final, describe(c.err))
		}
		if len(c.chunks) != 6 || c.final.DoneReason != "length" || c.final.EvalCount != 6 {
			t.Fatalf("chat: %d chunks %q, done_reason %q, eval_count %d; want 6, \"length\", 6", len(c.chunks), c.chunks, c.final.DoneReason, c.final.EvalCount)
		}
		body := s.lastRequest(t, "/v1/chat/completions")
		t.Logf("/v1/chat/completions body: %v", body)
		got, _ := json.Marshal(body["messages"])
		want := `[{"content":"be terse","role":"system"},{"content":"describe a cat","role":"user"}]`
		if string(got) != want || body["stream"] != true || body["n_predict"] != float64(6) {
			t.Fatalf("the runner received messages %s, stream %v, n_predict %v; want %s, true, 6", got, body["stream"], body["n_predict"], want)
		}
		if _, ok := body["response_format"]; ok {
			t.Fatalf("a chat without format sent response_format %v", body["response_format"])
		}
	})

	t.Run("chat_format_schema", func(t *testing.T) {
		c := s.chat(ctx, &api.ChatRequest{Model: model, Messages: messages, Format: schema, Options: map[string]any{"num_predict": 64}})
		if c.err != nil || c.final == nil {
			t.Fatalf("chat: final %v, error %s", c.final, describe(c.err))
		}
		got := strings.Join(c.chunks, "")
		t.Logf("chat with a schema format: %q in %d chunks, done_reason %q", got, len(c.chunks), c.final.DoneReason)
		wantInstance(t, got)
		if len(c.chunks) < 5 || c.final.DoneReason != "stop" {
			t.Fatalf("%d chunks, done_reason %q; want the object streamed in pieces and \"stop\"", len(c.chunks), c.final.DoneReason)
		}
		rf, _ := s.lastRequest(t, "/v1/chat/completions")["response_format"].(map[string]any)
		js, _ := rf["json_schema"].(map[string]any)
		if rf["type"] != "json_schema" {
			t.Fatalf("response_format %v, want type json_schema", rf)
		}
		wantSchema(t, js["schema"])
	})

	t.Run("generate_format_schema", func(t *testing.T) {
		g := s.generate(ctx, &api.GenerateRequest{Model: model, Prompt: "describe a cat", Format: schema, Options: map[string]any{"num_predict": 64}})
		if g.err != nil || g.final == nil {
			t.Fatalf("generate: final %v, error %s", g.final, describe(g.err))
		}
		wantInstance(t, strings.Join(g.tokens, ""))
		if g.final.DoneReason != "stop" {
			t.Fatalf("done_reason %q, want \"stop\"", g.final.DoneReason)
		}
		wantSchema(t, s.lastRequest(t, "/completion")["json_schema"])
	})

	t.Run("chat_image", func(t *testing.T) {
		// The tiny model has no vision; Ollama v0.34.4 still forwards the
		// image, and llama-server without --mmproj refuses it.
		png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x02\x00\x00\x00\x90wS\xde\x00\x00\x00\x10IDATx\x9cb\xfa\xcf\xc0\x00\x08\x00\x00\xff\xff\x03\x09\x01\x02X\xb6\xd5P\x00\x00\x00\x00IEND\xaeB`\x82")
		c := s.chat(ctx, &api.ChatRequest{Model: model, Messages: []api.Message{{Role: "user", Content: "what is this?", Images: []api.ImageData{png}}}, Options: map[string]any{"num_predict": 4}})
		t.Logf("chat with an image: %s", describe(c.err))
		var se api.StatusError
		if !errors.As(c.err, &se) || se.StatusCode != http.StatusInternalServerError || !strings.Contains(se.ErrorMessage, "image input is not supported") {
			t.Fatalf("chat with an image: %s; want HTTP 500 naming the unsupported image input", describe(c.err))
		}
	})
}
