package smi

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// MaxOutput bounds what Run keeps of a command's output. nvidia-smi prints
// a line per GPU or process, so a megabyte means something is wrong.
const MaxOutput = 1 << 20

// waitDelay bounds how long Run waits for the output pipes to close after
// the command exits or is killed (a child that inherited them can keep them
// open).
const waitDelay = time.Second

// Run runs the program at path with args and returns its standard output.
// The program is killed when ctx is done, and Run then returns
// context.Cause(ctx). A failed run's error includes the first line of what
// it printed (nvidia-smi explains failures on standard output).
func Run(ctx context.Context, path string, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, path, args...)
	stdout := &capped{max: MaxOutput}
	stderr := &capped{max: 4 << 10}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.WaitDelay = waitDelay
	err := cmd.Run()
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	if err != nil {
		msg := firstLine(stderr.Bytes())
		if msg == "" {
			msg = firstLine(stdout.Bytes())
		}
		if msg != "" {
			return nil, fmt.Errorf("%s: %w: %s", path, err, msg)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if stdout.over {
		return nil, fmt.Errorf("%s: %w", path, errTooMuchOutput)
	}
	return stdout.Bytes(), nil
}

var errTooMuchOutput = fmt.Errorf("output longer than %d bytes", MaxOutput)

// capped is a buffer that keeps at most max bytes and swallows the rest,
// so that a chatty child never blocks on a full pipe. It must not embed
// bytes.Buffer: os/exec copies with io.Copy, which would use the promoted
// ReadFrom and bypass the cap.
type capped struct {
	buf  bytes.Buffer
	max  int
	over bool
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.max - c.buf.Len(); len(p) > room {
		c.over = true
		c.buf.Write(p[:max(room, 0)])
		return len(p), nil
	}
	return c.buf.Write(p)
}

func (c *capped) Bytes() []byte { return c.buf.Bytes() }

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return clip(strings.TrimSpace(s))
}
