package main

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// unitFile is the systemd unit in the repository.
const unitFile = "vramgate.service"

// readUnit parses a systemd unit: section -> key -> values, in order.
func readUnit(t *testing.T, path string) map[string]map[string][]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := map[string]map[string][]string{}
	sec := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || line[0] == '#' || line[0] == ';':
		case line[0] == '[' && line[len(line)-1] == ']':
			sec = line[1 : len(line)-1]
			u[sec] = map[string][]string{}
		default:
			k, v, ok := strings.Cut(line, "=")
			if !ok || sec == "" {
				t.Fatalf("%s:%d: %q is not key=value in a section", path, n, line)
			}
			u[sec][strings.TrimSpace(k)] = append(u[sec][strings.TrimSpace(k)], strings.TrimSpace(v))
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return u
}

// The unit in the repository: systemd accepts it (systemd-analyze verify,
// where systemd is installed), its ExecStart runs the gate with flags the
// gate accepts, at Ollama's address in front of Ollama moved to 11435, and
// its hardening is there.
func TestServiceUnit(t *testing.T) {
	u := readUnit(t, unitFile)
	exec1 := u["Service"]["ExecStart"]
	if len(exec1) != 1 {
		t.Fatalf("ExecStart: %q, want one", exec1)
	}
	argv := strings.Fields(exec1[0])
	if argv[0] != "%h/go/bin/vramgate" {
		t.Fatalf("ExecStart runs %q, want %%h/go/bin/vramgate (where go install puts it)", argv[0])
	}
	cfg, err := (&cmd{stderr: io.Discard}).parse(argv[1:])
	if err != nil {
		t.Fatalf("ExecStart's flags %q: %v", argv[1:], err)
	}
	if cfg.listen != "127.0.0.1:11434" || cfg.ollama != "127.0.0.1:11435" {
		t.Fatalf("ExecStart: -listen %s -ollama %s, want Ollama's address in front of 127.0.0.1:11435", cfg.listen, cfg.ollama)
	}
	for key, want := range map[string]string{
		"NoNewPrivileges": "yes", "Restart": "on-failure", "KillSignal": "SIGTERM", "UMask": "0077",
		"SystemCallFilter": "@system-service", "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6 AF_NETLINK",
	} {
		if got := u["Service"][key]; len(got) != 1 || got[0] != want {
			t.Errorf("[Service] %s=%q, want %q", key, got, want)
		}
	}
	if got := u["Install"]["WantedBy"]; len(got) != 1 || got[0] != "default.target" {
		t.Errorf("[Install] WantedBy=%q: a user unit wants default.target", got)
	}

	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skipf("systemd-analyze is not installed (Debian's systemd package): the unit was parsed and its flags checked, not verified by systemd")
	}
	// verify wants ExecStart's binary to exist: this test's own, in a
	// copy of the unit; a user manager wants a runtime directory.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(unitFile)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	copyPath := filepath.Join(dir, unitFile)
	if err := os.WriteFile(copyPath, bytes.Replace(b, []byte("%h/go/bin/vramgate"), []byte(self), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	run := filepath.Join(dir, "run")
	if err := os.Mkdir(run, 0o700); err != nil {
		t.Fatal(err)
	}
	c := exec.CommandContext(t.Context(), sa, "--user", "verify", copyPath)
	c.Env = append(os.Environ(), "XDG_RUNTIME_DIR="+run, "SYSTEMD_LOG_LEVEL=notice")
	out, err := c.CombinedOutput()
	if err != nil || len(bytes.TrimSpace(out)) > 0 {
		// An unknown key is only a warning to systemd: any output fails.
		t.Fatalf("systemd-analyze --user verify %s: %v\n%s", unitFile, err, out)
	}
}

// The README's section on the service: both commands installed with go
// install, Ollama moved to the port the unit's ExecStart forwards to, the
// unit installed from where it is in the repository.
func TestREADMEService(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	i := strings.Index(readme, "### Run vramgate as a service\n")
	if i < 0 {
		t.Fatal(`the README has no section "Run vramgate as a service"`)
	}
	sec, _, _ := strings.Cut(readme[i:], "\n## ")
	argv := strings.Fields(readUnit(t, unitFile)["Service"]["ExecStart"][0])
	for _, want := range []string{
		"go install github.com/vramguard/vramguard/cmd/vramgate@latest\n",
		"go install github.com/vramguard/vramguard/cmd/vramwatch@latest\n",
		`Environment="OLLAMA_HOST=127.0.0.1:11435"`,
		"install -Dm644 cmd/vramgate/vramgate.service ~/.config/systemd/user/vramgate.service\n",
		"systemctl --user enable --now vramgate\n",
		"\nExecStart=" + strings.Join(argv, " ") + "\n",
	} {
		if !strings.Contains(sec, want) {
			t.Errorf("the README's service section lacks %q", want)
		}
	}
	for _, p := range []string{"../vramgate/main.go", "../vramwatch/main.go", unitFile} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("the README names %s: %v", p, err)
		}
	}
}
