package procs

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseListen(t *testing.T) {
	tests := []struct {
		line  string
		port  int
		inode string
		ok    bool
	}{
		{"   0: 0100007F:2CAA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0 100 0 0 10 0", 11434, "12345", true},
		{"   0: 0100007F:2CAA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0 100 0 0 10 0", 11435, "", false},
		{"   1: 0100007F:2CAA 0100007F:D2F0 01 00000000:00000000 00:00000000 00000000     0        0 12346 1 0 100 0 0 10 0", 11434, "", false}, // established
		{"   0: 00000000000000000000000000000000:2CAA 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 777 1 0", 11434, "777", true},
		{"  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode", 11434, "", false},
		{"   0: 0100007F:2CAA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 0 1", 11434, "", false}, // no inode
		{"garbage", 11434, "", false},
	}
	for i, tt := range tests {
		inode, ok := parseListen(tt.line, tt.port)
		if inode != tt.inode || ok != tt.ok {
			t.Errorf("%d: parseListen = %q, %v; want %q, %v", i, inode, ok, tt.inode, tt.ok)
		}
	}
}

// TestListeningServer: the server whose socket listens on the port is
// found; another server, a listener that is no server, and no listener
// are told apart.
func TestListeningServer(t *testing.T) {
	root := t.TempDir()
	write := func(path, s string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, path), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	proc := func(pid, ppid int, args ...string) {
		write(fmt.Sprintf("%d/stat", pid), fmt.Sprintf("%d (ollama) S %d %d %d 0 -1 4194560\n", pid, ppid, pid, pid))
		write(fmt.Sprintf("%d/cmdline", pid), strings.Join(args, "\x00")+"\x00")
	}
	sock := func(pid, inode int) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(root, fmt.Sprint(pid), "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(fmt.Sprintf("socket:[%d]", inode), filepath.Join(root, fmt.Sprint(pid), "fd", fmt.Sprint(inode))); err != nil {
			t.Fatal(err)
		}
	}
	proc(100, 1, "/usr/bin/ollama", "serve")
	proc(200, 1, "/usr/bin/ollama", "serve")
	proc(300, 1, "/usr/bin/python3", "fake.py")
	sock(100, 11)
	sock(200, 22)
	sock(300, 33)
	write("net/tcp", "  sl  local_address rem_address   st ...\n"+
		"   0: 0100007F:2CAA 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 11 1\n"+
		"   1: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 33 1\n")
	write("net/tcp6", "  sl  local_address ...\n"+
		"   0: 00000000000000000000000000000000:2CAB 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000  0 0 22 1\n")
	tests := []struct {
		port int
		pid  int
		why  string
	}{
		{11434, 100, ""},
		{11435, 200, ""}, // over IPv6
		{8080, 0, "no ollama serve process visible on this machine listens on port 8080"},
		{9999, 0, "nothing listens on port 9999"},
	}
	for _, tt := range tests {
		pid, why, err := ListeningServer(root, tt.port)
		if err != nil || pid != tt.pid || !strings.HasPrefix(why, tt.why) {
			t.Errorf("port %d: %d, %q, %v; want %d, %q", tt.port, pid, why, err, tt.pid, tt.why)
		}
	}
	if pid, why, err := ListeningServer(filepath.Join(root, "missing"), 11434); pid != 0 || err == nil && !strings.Contains(why, "socket tables") {
		t.Errorf("missing root: %d, %q, %v", pid, why, err)
	}
}
