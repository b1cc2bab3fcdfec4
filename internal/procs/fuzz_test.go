package procs

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// FuzzParseStat: any bytes a procfs read can hold (a process chooses its
// own comm) parse without panic, and what parses formats back to a line
// that parses the same.
func FuzzParseStat(f *testing.F) {
	for _, s := range []string{
		"4242 (llama-server) S 4100 4242 4242 0 -1 4194560\n",
		"77 (a b) c) d) R 1 77", "78 (() Z 5 78", "79 () S 2", "", "1 (", ")(", "5 (x) S 99999999999",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := ParseStat(b)
		if err != nil {
			return
		}
		if st.PID <= 0 || st.PPID < 0 || !bytes.Contains(b, []byte(st.Comm)) {
			t.Fatalf("ParseStat(%q) = %+v", b, st)
		}
		again, err := ParseStat(fmt.Appendf(nil, "%d (%s) %s %d 0 0", st.PID, st.Comm, []byte{st.State}, st.PPID))
		if err != nil || again != st {
			t.Fatalf("ParseStat(%q) = %+v, which reads back as %+v, %v", b, st, again, err)
		}
	})
}

// FuzzClassify: any command line classifies without panic, and the result
// is consistent: a blob is well formed and lies in the model path, a
// discovery process has no model, a runner has a generation.
func FuzzClassify(f *testing.F) {
	for _, s := range []string{
		"/usr/lib/ollama/llama-server\x00--model\x00/m/blobs/sha256-" + hexA + "\x00--port\x001",
		"/usr/bin/ollama\x00runner\x00--ollama-engine\x00--port\x001",
		"/usr/bin/ollama\x00serve", "llama-server\x00-m\x00model.gguf", "llama-server\x00--list-devices",
		"/usr/bin/ollama runner --model /m --port 1", "\xff\x00-m=", "ollama\x00runner\x00--model", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, cmdline string) {
		args := SplitArgs([]byte(cmdline))
		info := Classify(args)
		if info.Blob != "" && (BlobOf(info.Blob) != info.Blob || !strings.Contains(strings.ToLower(info.ModelPath), info.Blob[len("sha256:"):])) {
			t.Fatalf("Classify(%q): blob %q not from model path %q", args, info.Blob, info.ModelPath)
		}
		switch info.Role {
		case RoleDiscovery:
			if info.ModelPath != "" || info.Blob != "" || info.Model != "" {
				t.Fatalf("Classify(%q): discovery with a model: %+v", args, info)
			}
		case RoleRunner:
			if info.Generation == GenUnknown {
				t.Fatalf("Classify(%q): runner without generation: %+v", args, info)
			}
		}
		if info.Role > RoleClient {
			t.Fatalf("Classify(%q): role %v", args, info.Role)
		}
	})
}
