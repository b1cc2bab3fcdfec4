package vramguard

import "testing"

func TestIsLocalHost(t *testing.T) {
	tests := []struct {
		host string
		want bool
	}{
		{"http://127.0.0.1:11434", true},
		{"http://127.8.9.10:1", true},
		{"http://localhost:11434", true},
		{"http://LOCALHOST:11434", true},
		{"http://ollama.localhost:11434", true},
		{"http://[::1]:11434", true},
		{"http://0.0.0.0:11434", true},
		{"http://[::]:11434", true},
		{"https://localhost:443/prefix", true},
		{"127.0.0.1:11434", true},
		{"localhost", true},
		{"::1", true},
		{"http://[fe80::1%25eth0]:11434", false},
		{"http://10.0.0.5:11434", false},
		{"http://192.168.1.20:11434", false},
		{"http://gpu-box:11434", false},
		{"http://localhost.example.com:11434", false},
		{"http://[2001:db8::1]:11434", false},
		{"", false},
	}
	for _, tt := range tests {
		if got := isLocalHost(tt.host); got != tt.want {
			t.Errorf("isLocalHost(%q) = %v, want %v", tt.host, got, tt.want)
		}
	}
}
