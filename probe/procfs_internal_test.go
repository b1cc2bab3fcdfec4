package probe

import "testing"

func TestIsLocal(t *testing.T) {
	for host, want := range map[string]bool{
		"http://127.0.0.1:11434": true, "127.0.0.1:11434": true, "localhost": true, "http://[::1]:11434": true,
		"0.0.0.0:11434": true, "gpu.localhost": true, "http://gpu-box:11434": false, "10.0.0.5": false, "https://ollama.com": false,
	} {
		if got := isLocal(host); got != want {
			t.Errorf("isLocal(%q) = %v, want %v", host, got, want)
		}
	}
}
