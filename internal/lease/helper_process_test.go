//go:build darwin || dragonfly || freebsd || illumos || linux || netbsd || openbsd

package lease

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
)

const (
	helperEnv   = "VRAMGUARD_LEASE_HELPER_DIR"
	helperModel = "held-by-helper:1b"
	// helperReserveEnv makes the helper take a reservation instead.
	helperReserveEnv = "VRAMGUARD_LEASE_HELPER_RESERVE"
)

// helperCommand runs this test binary again as TestHelperHolder: a second
// process that takes a lease in dir, prints its ID and waits for stdin to
// close.
func helperCommand(t *testing.T, dir string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperHolder$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"="+dir)
	cmd.Stderr = os.Stderr
	return cmd
}

// TestHelperHolder is the second process of TestKilledHolder; run
// directly, it does nothing.
func TestHelperHolder(t *testing.T) {
	dir := os.Getenv(helperEnv)
	if dir == "" {
		t.Skip("the holder process of TestKilledHolder; runs only as that")
	}
	d, err := Open(Options{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	r := Record{Server: "127.0.0.1:11434", Model: helperModel, Note: "helper"}
	if os.Getenv(helperReserveEnv) != "" {
		r = Record{Device: 1, Bytes: 10 << 30, For: "render", Note: "helper"}
	}
	h, err := d.Acquire(r)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Println(h.Record().ID)
	// Wait until killed; stdin's end (the parent gone) ends it too, so no
	// helper outlives a crashed test.
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = h.Release()
}

// readLine reads the helper's first line.
func readLine(r io.Reader) (string, error) {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		return line, errors.Join(errors.New("helper printed no line"), err)
	}
	return strings.TrimSpace(line), nil
}
