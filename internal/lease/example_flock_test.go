//go:build darwin || dragonfly || freebsd || illumos || linux || netbsd || openbsd

package lease_test

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/vramguard/vramguard/internal/lease"
)

// A program takes a lease on the model it is about to use, and another
// (here the same one) sees it until it is released. Options{} would use the
// per-user default directory; the example uses a fresh one.
func ExampleDir_Acquire() {
	tmp, err := os.MkdirTemp("", "lease-example")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer os.RemoveAll(tmp)
	d, err := lease.Open(lease.Options{Dir: filepath.Join(tmp, "leases")})
	if err != nil {
		fmt.Println(err)
		return
	}
	h, err := d.Acquire(lease.Record{Server: "http://localhost:11434", Model: "qwen3:8b", Note: "captioning"})
	if err != nil {
		fmt.Println(err)
		return
	}
	live, err := d.Live("127.0.0.1:11434", "qwen3:8b")
	for _, r := range live {
		fmt.Println(r.Server, r.Model, r.Note, r.PID == os.Getpid())
	}
	fmt.Println(len(live), err)
	if err := h.Release(); err != nil {
		fmt.Println(err)
	}
	live, err = d.Live("", "")
	fmt.Println(len(live), err)
	// Output:
	// 127.0.0.1:11434 qwen3:8b captioning true
	// 1 <nil>
	// 0 <nil>
}
