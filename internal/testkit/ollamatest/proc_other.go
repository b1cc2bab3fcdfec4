//go:build !linux

package ollamatest

import (
	"errors"
	"os"
	"syscall"
)

func setDeathSignal(*syscall.SysProcAttr) {}

type proc struct {
	pid, ppid, pgid int
	state           byte
	args            []string
}

func listProcs() ([]proc, error) { return nil, errors.ErrUnsupported }

func readProc(pid int) (proc, bool) { return proc{}, false }

func alive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	return p.Signal(syscall.Signal(0)) == nil
}
