//go:build unix

package ollamatest

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// signalGroup sends SIGTERM, or SIGKILL when force is set, to every process
// in the process group led by pgid. A group that no longer exists is not an
// error.
func signalGroup(pgid int, force bool) error {
	sig := syscall.SIGTERM
	if force {
		sig = syscall.SIGKILL
	}
	err := syscall.Kill(-pgid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// killProcess sends SIGKILL to one process.
func killProcess(pid int) error {
	err := syscall.Kill(pid, syscall.SIGKILL)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// newGroup makes cmd the leader of a new process group, so that signalGroup
// reaches it and every child it starts (the ollama runners).
func newGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	setDeathSignal(cmd.SysProcAttr)
}

// tryLock takes an exclusive advisory lock on f without blocking. It
// reports false if another process holds it.
func tryLock(f *os.File) (bool, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return false, nil
	}
	return err == nil, err
}
