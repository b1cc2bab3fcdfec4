package lease_test

import (
	"fmt"

	"github.com/vramguard/vramguard/internal/lease"
)

func ExampleNormalizeServer() {
	for _, host := range []string{"http://LOCALHOST:11434/", "localhost", "https://gpu-box/ollama", "[::1]:1"} {
		fmt.Println(lease.NormalizeServer(host))
	}
	// Output:
	// 127.0.0.1:11434
	// 127.0.0.1:11434
	// gpu-box:443
	// [::1]:1
}

func ExampleParse() {
	r, err := lease.Parse([]byte(`{"v":1,"id":"0123456789abcdef","server":"127.0.0.1:11434","model":"qwen3:8b","pid":4242,"program":"caption","created":"2025-01-02T03:04:05Z"}`))
	fmt.Println(r.Model, r.PID, r.Until.IsZero(), err)
	_, err = lease.Parse([]byte(`{"v":2}`))
	fmt.Println(err)
	// Output:
	// qwen3:8b 4242 true <nil>
	// lease parse: malformed lease: v is 2, not 1
}
