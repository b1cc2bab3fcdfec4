package vramguard

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// generateCLI runs the generation through `ollama run MODEL --keepalive K
// --nowordwrap` with the prompt on stdin and the answer on stdout, under the
// same three timeouts as the streaming path. It always sends a keep-alive
// (the CLI's default is 5 minutes), and after an unload keep-alive it
// verifies that the model is gone, because a model left by the fallback is
// the failure this library exists to prevent.
func (c *OllamaClient) generateCLI(ctx context.Context, req *GenerateRequest, ka KeepAlive, fn ChunkFunc) (*Generation, error) {
	const op = "generate (cli)"
	bin := c.opts.CLIPath
	if bin == "" {
		bin = "ollama"
	}
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, newError(op, req.Model, KindUnavailable, err)
	}
	if ka.mode == keepAliveServer {
		ka = KeepAliveUnload
	}
	end, err := c.begin(op, req.Model, ka)
	if err != nil {
		return nil, err
	}
	gen, err := func() (*Generation, error) {
		defer end()
		return c.runCLI(ctx, path, req, ka, fn)
	}()
	if ka.IsUnload() {
		// Whatever happened, leave nothing resident.
		if _, uerr := c.Cleanup(ctx, CleanupOptions{Models: []string{req.Model}}); uerr != nil && err == nil {
			err = uerr
		}
	}
	if err != nil {
		return nil, err
	}
	return gen, nil
}

func (c *OllamaClient) runCLI(ctx context.Context, path string, req *GenerateRequest, ka KeepAlive, fn ChunkFunc) (*Generation, error) {
	const op = "generate (cli)"
	t := req.Timeouts.or(c.opts.Timeouts)
	wd := newWatchdog(ctx, t)
	defer wd.release()

	args := []string{"run", req.Model, "--nowordwrap", "--keepalive", ka.CLIFlag()}
	if req.Think != nil {
		args = append(args, fmt.Sprintf("--think=%t", *req.Think))
	}
	cmd := exec.CommandContext(wd.ctx, path, args...)
	cmd.Env = os.Environ()
	if c.host != "" {
		cmd.Env = append(cmd.Env, "OLLAMA_HOST="+c.host)
	}
	prompt := req.Prompt
	if req.System != "" {
		prompt = req.System + "\n\n" + req.Prompt
	}
	cmd.Stdin = strings.NewReader(prompt)
	stderr := &tailBuffer{max: 4096}
	cmd.Stderr = stderr
	cmd.WaitDelay = time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, newError(op, req.Model, KindInternal, err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, newError(op, req.Model, KindUnavailable, err)
	}

	var text strings.Builder
	var first time.Duration
	var fnErr error
	chunks := 0
	buf := make([]byte, 4096)
	for {
		n, rerr := stdout.Read(buf)
		if n > 0 {
			if chunks == 0 {
				first = time.Since(start)
			}
			wd.chunk()
			chunks++
			piece := string(buf[:n])
			text.WriteString(piece)
			if fn != nil && fnErr == nil {
				if fnErr = fn(Chunk{Text: piece, Index: chunks, Bytes: text.Len(), Elapsed: time.Since(start)}); fnErr != nil {
					wd.abort(fnErr)
				}
			}
		}
		if rerr != nil {
			break
		}
	}
	werr := cmd.Wait()
	if err := wd.finish(op, req.Model, ctx, fnErr); err != nil {
		return nil, err
	}
	if werr != nil {
		msg := strings.TrimSpace(stderr.String())
		var ee *exec.ExitError
		if msg == "" || !errors.As(werr, &ee) {
			msg = werr.Error()
		}
		return nil, newError(op, req.Model, classifyMessage(msg), fmt.Errorf("%w: %s", werr, lastLine(msg)))
	}
	out := strings.TrimRight(text.String(), "\n")
	if fn != nil {
		if err := fn(Chunk{Index: chunks + 1, Bytes: len(out), Elapsed: time.Since(start), Done: true}); err != nil {
			return nil, newError(op, req.Model, KindCanceled, fmt.Errorf("chunk callback: %w", err))
		}
	}
	return &Generation{
		Model:      req.Model,
		Text:       out,
		DoneReason: "stop",
		Chunks:     chunks,
		Fallback:   true,
		FirstChunk: first,
		Elapsed:    time.Since(start),
	}, nil
}

// lastLine returns the last non-empty line of s, without the CLI's spinner
// escape sequences.
func lastLine(s string) string {
	lines := strings.Split(s, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(stripANSI(lines[i]))
		if l != "" {
			return l
		}
	}
	return ""
}

// stripANSI removes CSI escape sequences (the CLI's spinner).
func stripANSI(s string) string {
	if !strings.Contains(s, "\x1b") {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == 0x1b && i+1 < len(s) && s[i+1] == '[' {
			j := i + 2
			for j < len(s) && (s[j] < 0x40 || s[j] > 0x7e) {
				j++
			}
			i = j
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(p)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.buf.String()
}

var _ io.Writer = (*tailBuffer)(nil)
