package procs

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
)

// NothingListens begins ListeningServer's why when no socket listens on
// the port at all (a server that is restarting, or down).
const NothingListens = "nothing listens on port"

// ListeningServer finds the live `ollama serve` under root ("" means
// /proc) that owns a TCP socket listening on port, IPv4 or IPv6, as the
// socket tables of root/net (this network namespace's) and the servers'
// open files (root/<pid>/fd) show. It returns the server's PID, or 0 and
// why no visible server can be tied to the port: nothing listens there in
// this network namespace, the listener is no `ollama serve` this process
// table shows (an in-process fake, a server in a container or another PID
// namespace), or a server's open files cannot be read (another user's
// process). It fails only when root cannot be listed.
//
// It is what makes a runner check honest: an unrelated `ollama serve` on
// this machine (another port, another container) is never taken for the
// server at the client's address.
func ListeningServer(root string, port int) (pid int, why string, err error) {
	return listening(root, port, "ollama serve", maybeOllama, func(p Process) bool {
		server, _ := isLiveServer(p)
		return server
	})
}

// Listening is ListeningServer for any live process that keep accepts
// (what names it in why). It reads every process's command line.
func Listening(root string, port int, what string, keep func(Process) bool) (pid int, why string, err error) {
	return listening(root, port, what, func([]byte) bool { return true }, keep)
}

func listening(root string, port int, what string, comm func([]byte) bool, keep func(Process) bool) (pid int, why string, err error) {
	root = rootOf(root)
	inodes, err := listenInodes(root, port)
	if err != nil {
		return 0, fmt.Sprintf("cannot read this machine's socket tables: %v", err), nil
	}
	if len(inodes) == 0 {
		return 0, fmt.Sprintf("%s %d in this network namespace", NothingListens, port), nil
	}
	seen, err := scanWhere(root, make([]byte, MaxArgsBytes), comm)
	if err != nil {
		return 0, "", err
	}
	var pids []int
	for pid, p := range seen {
		if p.State != 'Z' && p.State != 'X' && p.State != 'x' && keep(p) {
			pids = append(pids, pid)
		}
	}
	slices.Sort(pids)
	var denied []int
	for _, pid := range pids {
		owns, err := ownsSocket(root, pid, inodes)
		switch {
		case errors.Is(err, fs.ErrPermission):
			denied = append(denied, pid)
		case owns:
			return pid, "", nil
		}
	}
	if len(denied) > 0 {
		return 0, fmt.Sprintf("the open files of %s pid %v cannot be read (permission), so which one listens on port %d is not known", what, denied, port), nil
	}
	return 0, fmt.Sprintf("no %s process visible on this machine listens on port %d (an in-process server, or one in a container or another PID namespace)", what, port), nil
}

// listenInodes returns the inodes of the sockets listening on port in
// root/net/tcp and root/net/tcp6 (a missing table, as without IPv6, is
// empty).
func listenInodes(root string, port int) (map[string]bool, error) {
	out := map[string]bool{}
	found := false
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(root + "/net/" + table)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		found = true
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if inode, ok := parseListen(sc.Text(), port); ok {
				out[inode] = true
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	if !found {
		return nil, fmt.Errorf("no %s/net/tcp", root)
	}
	return out, nil
}

// parseListen reads one line of /proc/net/tcp or tcp6 ("sl local rem st
// ... inode ..."): the socket's inode, when it listens (state 0A) on port.
func parseListen(line string, port int) (inode string, ok bool) {
	fs := strings.Fields(line)
	if len(fs) < 10 || fs[3] != "0A" {
		return "", false
	}
	i := strings.LastIndexByte(fs[1], ':')
	if i < 0 {
		return "", false
	}
	p, err := strconv.ParseUint(fs[1][i+1:], 16, 16)
	if err != nil || int(p) != port || fs[9] == "0" {
		return "", false
	}
	return fs[9], true
}

// ownsSocket reports whether pid has one of the socket inodes open.
func ownsSocket(root string, pid int, inodes map[string]bool) (bool, error) {
	dir := root + "/" + strconv.Itoa(pid) + "/fd"
	d, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return false, err
	}
	for _, n := range names {
		target, err := os.Readlink(dir + "/" + n)
		if err != nil {
			continue
		}
		if rest, ok := strings.CutPrefix(target, "socket:["); ok && inodes[strings.TrimSuffix(rest, "]")] {
			return true, nil
		}
	}
	return false, nil
}
