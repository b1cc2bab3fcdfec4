//go:build !unix

package ollamatest

import (
	"errors"
	"os"
	"os/exec"
)

func signalGroup(pgid int, force bool) error {
	p, err := os.FindProcess(pgid)
	if err != nil {
		return err
	}
	if force {
		return p.Kill()
	}
	return errors.ErrUnsupported
}

func killProcess(pid int) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return err
	}
	return p.Kill()
}

func newGroup(cmd *exec.Cmd) {}

// tryLock always succeeds: builds are not serialised on this platform.
func tryLock(f *os.File) (bool, error) { return true, nil }
