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

func TestPortOf(t *testing.T) {
	for host, want := range map[string]int{
		"http://127.0.0.1:11435": 11435, "127.0.0.1:8080": 8080, "http://localhost": 11434, "localhost": 11434,
		"https://localhost": 443, "http://[::1]:9000/ollama": 9000, "http://127.0.0.1:0": 0, "http://127.0.0.1:99999": 0,
	} {
		got, ok := portOf(host)
		if got != want || ok != (want != 0) {
			t.Errorf("portOf(%q) = %d, %v; want %d", host, got, ok, want)
		}
	}
}
