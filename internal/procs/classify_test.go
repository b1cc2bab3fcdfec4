package procs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const (
	hexA = "6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"
	hexB = "e8ad13eff07a78d89926e9e8b882317d082ef5bf9768ad7b50fcdbbcd63748de"
)

func TestClassify(t *testing.T) {
	blobA := "sha256:" + hexA
	tests := []struct {
		name string
		args []string
		want Info
	}{
		// Nothing to go by.
		{"nil", nil, Info{}},
		{"empty exe", []string{""}, Info{}},
		{"blank exe", []string{"  "}, Info{}},
		{"bare ollama (nvidia-smi)", []string{"/usr/local/bin/ollama"}, Info{}},
		{"bare ollama.exe (nvidia-smi on Windows)", []string{`C:\Users\ada\AppData\Local\Programs\Ollama\ollama.exe`}, Info{}},
		{"bare llama-server in lib/ollama (nvidia-smi)", []string{"/usr/lib/ollama/llama-server"}, Info{Generation: GenLlamaServer}},
		{"bare llama-server.exe in lib\\ollama", []string{`C:\Program Files\Ollama\lib\ollama\llama-server.exe`}, Info{Generation: GenLlamaServer}},

		// Servers and the CLI.
		{"server", []string{"/usr/local/bin/ollama", "serve"}, Info{Role: RoleServer}},
		{"server with global flag", []string{"ollama", "--verbose", "serve"}, Info{Role: RoleServer}},
		{"server on Windows", []string{`C:\Users\ada\AppData\Local\Programs\Ollama\ollama.exe`, "serve"}, Info{Role: RoleServer}},
		{"cli run", []string{"ollama", "run", "llama3"}, Info{Role: RoleClient}},
		{"cli version", []string{"ollama", "--version"}, Info{Role: RoleClient}},

		// Generation 1: ollama runner, up to v0.24.
		{"v0.17.4 runner", []string{"/root/.cache/vramguard/ollama/0.17.4/ollama", "runner", "--model", "/tmp/x/models/blobs/sha256-" + hexA, "--port", "40123"},
			Info{Role: RoleRunner, Generation: GenOllamaRunner, ModelPath: "/tmp/x/models/blobs/sha256-" + hexA, Blob: blobA}},
		{"v0.17.4 new engine", []string{"/root/.cache/vramguard/ollama/0.17.4/ollama", "runner", "--ollama-engine", "--model", "/tmp/x/models/blobs/sha256-" + hexA, "--port", "40124"},
			Info{Role: RoleRunner, Generation: GenOllamaRunner, ModelPath: "/tmp/x/models/blobs/sha256-" + hexA, Blob: blobA}},
		{"v0.6.5 runner", []string{"/usr/local/bin/ollama", "runner", "--model", "/usr/share/ollama/.ollama/models/blobs/sha256-" + hexA, "--ctx-size", "8192", "--batch-size", "512", "--n-gpu-layers", "29", "--threads", "8", "--parallel", "4", "--port", "35411"},
			Info{Role: RoleRunner, Generation: GenOllamaRunner, ModelPath: "/usr/share/ollama/.ollama/models/blobs/sha256-" + hexA, Blob: blobA}},
		{"runner --model=", []string{"ollama", "runner", "--model=/m/blobs/sha256-" + hexA},
			Info{Role: RoleRunner, Generation: GenOllamaRunner, ModelPath: "/m/blobs/sha256-" + hexA, Blob: blobA}},
		{"v0.24.0 discovery", []string{"/root/.cache/vramguard/ollama/0.24.0/ollama", "runner", "--ollama-engine", "--port", "40124"},
			Info{Role: RoleDiscovery, Generation: GenOllamaRunner}},
		{"runner of a deleted binary", []string{"/usr/bin/ollama (deleted)", "runner", "--model", "/m/blobs/sha256-" + hexA},
			Info{Role: RoleRunner, Generation: GenOllamaRunner, ModelPath: "/m/blobs/sha256-" + hexA, Blob: blobA}},
		{"runner argv rewritten into one string", []string{"/usr/local/bin/ollama runner --model /m/blobs/sha256-" + hexA + " --port 1"},
			Info{Role: RoleRunner, Generation: GenOllamaRunner, ModelPath: "/m/blobs/sha256-" + hexA, Blob: blobA}},
		{"runner without model or engine flag", []string{"/usr/local/bin/ollama", "runner", "--port", "40000"},
			Info{Role: RoleRunner, Generation: GenOllamaRunner}},
		{"v0.34.4 MLX runner names its model", []string{"/usr/local/bin/ollama", "runner", "--model", "qwen3:latest", "--port", "40127"},
			Info{Role: RoleRunner, Generation: GenOllamaRunner, ModelPath: "qwen3:latest", Model: "qwen3:latest"}},
		{"v0.34.4 gpu-discover", []string{"/usr/local/bin/ollama", "gpu-discover", "--lib-dir", "/usr/local/lib/ollama"},
			Info{Role: RoleDiscovery, Generation: GenOllamaRunner}},
		{"old ollama_llama_server", []string{"/tmp/ollama1180235561/runners/cuda_v12/ollama_llama_server", "--model", "/root/.ollama/models/blobs/sha256-" + hexA, "--ctx-size", "2048", "--port", "35555"},
			Info{Role: RoleRunner, Generation: GenLegacy, ModelPath: "/root/.ollama/models/blobs/sha256-" + hexA, Blob: blobA}},
		{"bare ollama_llama_server (nvidia-smi)", []string{"/tmp/ollama1180235561/runners/cuda_v12/ollama_llama_server"},
			Info{Role: RoleRunner, Generation: GenLegacy}},

		// Generation 2: llama-server, from v0.30.
		{"v0.34.4 runner", []string{"/usr/lib/ollama/llama-server", "--model", "/root/.ollama/models/blobs/sha256-" + hexA, "--port", "40125", "--host", "127.0.0.1", "--ctx-size", "4096"},
			Info{Role: RoleRunner, Generation: GenLlamaServer, ModelPath: "/root/.ollama/models/blobs/sha256-" + hexA, Blob: blobA}},
		{"v0.34.4 runner as started", []string{"/usr/local/lib/ollama/llama-server", "--model", "/usr/share/ollama/.ollama/models/blobs/sha256-" + hexB, "--port", "38217", "--host", "127.0.0.1", "--no-webui", "--offline", "-c", "8192", "-np", "1", "--jinja"},
			Info{Role: RoleRunner, Generation: GenLlamaServer, ModelPath: "/usr/share/ollama/.ollama/models/blobs/sha256-" + hexB, Blob: "sha256:" + hexB}},
		{"llama-server of a dev build, blob model", []string{"/src/ollama/build/llama-server-cpu/bin/llama-server", "--model", "/home/ada/.ollama/models/blobs/sha256-" + hexA, "--port", "1"},
			Info{Role: RoleRunner, Generation: GenLlamaServer, ModelPath: "/home/ada/.ollama/models/blobs/sha256-" + hexA, Blob: blobA}},
		{"llama-server in lib/ollama, -m", []string{"/usr/lib/ollama/llama-server", "-m", "/srv/models/qwen.gguf", "--port", "1"},
			Info{Role: RoleRunner, Generation: GenLlamaServer, ModelPath: "/srv/models/qwen.gguf"}},
		{"llama-server split model alias", []string{"/usr/lib/ollama/llama-server", "--model", "/root/.ollama/models/blobs/.ollama-split-6a0746a1ec1a-123/model-00001-of-00002.gguf"},
			Info{Role: RoleRunner, Generation: GenLlamaServer, ModelPath: "/root/.ollama/models/blobs/.ollama-split-6a0746a1ec1a-123/model-00001-of-00002.gguf"}},
		{"split alias from a dev build", []string{"/src/build/llama-server-cpu/bin/llama-server", "--model", "/m/blobs/.ollama-split-abc-1/model-00001-of-00003.gguf"},
			Info{Role: RoleRunner, Generation: GenLlamaServer, ModelPath: "/m/blobs/.ollama-split-abc-1/model-00001-of-00003.gguf"}},
		{"list-devices", []string{"/usr/lib/ollama/llama-server", "--list-devices", "--offline", "--verbose"},
			Info{Role: RoleDiscovery, Generation: GenLlamaServer}},
		{"list-devices anywhere", []string{"llama-server", "--list-devices"},
			Info{Role: RoleDiscovery, Generation: GenLlamaServer}},
		{"discovery start without model", []string{"/usr/lib/ollama/llama-server", "--port", "40126"},
			Info{Role: RoleDiscovery, Generation: GenLlamaServer}},
		{"discovery start as started", []string{"/usr/local/lib/ollama/llama-server", "--port", "53011", "--host", "127.0.0.1", "--no-webui", "--offline", "--verbose"},
			Info{Role: RoleDiscovery, Generation: GenLlamaServer}},

		// A user's own llama-server.
		{"user llama-server -m", []string{"llama-server", "-m", "model.gguf"}, Info{Role: RoleOther, ModelPath: "model.gguf"}},
		{"user llama-server --model", []string{"/opt/llama.cpp/build/bin/llama-server", "--model", "/data/qwen3-8b-q4_k_m.gguf", "--port", "8080"},
			Info{Role: RoleOther, ModelPath: "/data/qwen3-8b-q4_k_m.gguf"}},
		{"user llama-server -hf", []string{"llama-server", "-hf", "ggml-org/gemma-3-1b-it-GGUF"}, Info{Role: RoleOther}},
		{"user llama-server router", []string{"llama-server", "--models-dir", "/data/models"}, Info{Role: RoleOther}},
		{"user llama-server named sha256 file outside blobs", []string{"llama-server", "-m", "/tmp/sha256-" + hexA},
			Info{Role: RoleOther, ModelPath: "/tmp/sha256-" + hexA, Blob: blobA}},
		{"bare llama-server elsewhere", []string{"/usr/local/bin/llama-server"}, Info{Role: RoleOther}},

		// Not Ollama at all.
		{"python", []string{"/home/ada/ComfyUI/venv/bin/python", "main.py", "--listen"}, Info{Role: RoleOther}},
		{"words in one string", []string{"python3 ollama runner"}, Info{Role: RoleOther}},
		{"xorg", []string{"/usr/lib/xorg/Xorg"}, Info{Role: RoleOther}},
		{"llama-server-ish name", []string{"/usr/bin/llama-server2", "-m", "/m/blobs/sha256-" + hexA}, Info{Role: RoleOther}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Classify(tt.args); got != tt.want {
				t.Errorf("Classify(%q) =\n%+v\nwant\n%+v", tt.args, got, tt.want)
			}
		})
	}
}

func TestBlobOf(t *testing.T) {
	tests := []struct{ in, want string }{
		{"/root/.ollama/models/blobs/sha256-" + hexA, "sha256:" + hexA},
		{`C:\Users\ada\.ollama\models\blobs\sha256-` + hexA, "sha256:" + hexA},
		{"/m/blobs/sha256:" + hexA, "sha256:" + hexA}, // older layout
		{"sha256:" + hexA, "sha256:" + hexA},
		{"sha256-" + strings.ToUpper(hexA), "sha256:" + hexA},
		{" /m/blobs/sha256-" + hexA + " ", "sha256:" + hexA},
		{"/m/blobs/sha256-" + hexA[:63], ""},
		{"/m/blobs/sha256-" + hexA + "0", ""},
		{"/m/blobs/sha256-" + hexA[:63] + "g", ""},
		{"/m/blobs/sha512-" + hexA, ""},
		{"/m/blobs/sha256_" + hexA, ""},
		{"/m/blobs/", ""},
		{"", ""},
		{"model.gguf", ""},
	}
	for _, tt := range tests {
		if got := BlobOf(tt.in); got != tt.want {
			t.Errorf("BlobOf(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestMaybeOllama(t *testing.T) {
	for comm, want := range map[string]bool{
		"ollama": true, "ollama_llama_se": true, "llama-server": true, "Ollama": true,
		"llama-server2": false, "python3": false, "": false, "olla": false, "systemd": false,
	} {
		if got := MaybeOllama(comm); got != want {
			t.Errorf("MaybeOllama(%q) = %v, want %v", comm, got, want)
		}
	}
}

// TestCapturedCmdlines classifies command lines copied from real machines:
// testdata/cmdline/<role>-<anything>.cmdline holds the raw bytes of a
// /proc/<pid>/cmdline (cp /proc/$PID/cmdline testdata/cmdline/runner-v0.34.4-cuda.cmdline),
// and the name's first word is the role it must get. A runner must also
// yield a blob unless its name says "noblob".
func TestCapturedCmdlines(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "cmdline", "*.cmdline"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no captured command lines in testdata/cmdline")
	}
	roles := map[string]Role{}
	for r := RoleUnknown; r <= RoleClient; r++ {
		roles[r.String()] = r
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".cmdline")
		t.Run(name, func(t *testing.T) {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			word, _, _ := strings.Cut(name, "-")
			want, ok := roles[word]
			if !ok {
				t.Fatalf("file name %q does not start with a role (%v)", name, roles)
			}
			info := Classify(SplitArgs(b))
			if info.Role != want {
				t.Errorf("role %v, want %v (info %+v)", info.Role, want, info)
			}
			if want == RoleRunner && !strings.Contains(name, "noblob") && info.Blob == "" {
				t.Errorf("runner without a blob: %+v", info)
			}
		})
	}
}
