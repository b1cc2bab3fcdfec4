package ollamatest

import (
	"bytes"
	"os"
	"strconv"
	"syscall"
)

// setDeathSignal asks the kernel to send SIGTERM to the server if the test
// process dies without stopping it (a panic, a timeout, a kill). The server
// handles SIGTERM by unloading every runner and exiting.
func setDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGTERM }

// proc is one entry of /proc.
type proc struct {
	pid, ppid, pgid int
	state           byte
	args            []string
}

// listProcs reads every process from /proc. Processes that vanish while it
// reads are skipped.
func listProcs() ([]proc, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if p, ok := readProc(pid); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// readProc reads /proc/<pid>/stat and cmdline. ok is false if the process
// is gone.
func readProc(pid int) (proc, bool) {
	dir := "/proc/" + strconv.Itoa(pid)
	stat, err := os.ReadFile(dir + "/stat")
	if err != nil {
		return proc{}, false
	}
	// pid (comm) state ppid pgrp ...; comm may contain spaces and ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return proc{}, false
	}
	f := bytes.Fields(stat[i+1:])
	if len(f) < 3 || len(f[0]) != 1 {
		return proc{}, false
	}
	p := proc{pid: pid, state: f[0][0]}
	p.ppid, _ = strconv.Atoi(string(f[1]))
	p.pgid, _ = strconv.Atoi(string(f[2]))
	if cmd, err := os.ReadFile(dir + "/cmdline"); err == nil {
		for a := range bytes.SplitSeq(bytes.TrimRight(cmd, "\x00"), []byte{0}) {
			p.args = append(p.args, string(a))
		}
	}
	return p, true
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	p, ok := readProc(pid)
	return ok && p.state != 'Z' && p.state != 'X'
}
