// Command nvidia-smi is the fake nvidia-smi of the kill test (package
// handoff): it answers internal/smi's two queries, in MiB, from the device
// the test serves as JSON at $VRAMGUARD_HANDOFF_SMI. It lists no
// processes: the gate admits by free memory. It is a program of its own,
// not the test binary, so that it starts in a millisecond even when the
// test runs under -race: the gate runs it twice per reading.
package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	for _, a := range os.Args[1:] {
		if strings.HasPrefix(a, "--query-compute-apps") {
			return // no processes
		}
	}
	hc := &http.Client{Timeout: 5 * time.Second}
	resp, err := hc.Get(os.Getenv("VRAMGUARD_HANDOFF_SMI"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake nvidia-smi:", err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	var snap struct {
		Devices []struct {
			Index       int
			Name, UUID  string
			Total, Free uint64
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
		fmt.Fprintln(os.Stderr, "fake nvidia-smi:", err)
		os.Exit(1)
	}
	const mib = 1 << 20
	for _, d := range snap.Devices {
		fmt.Printf("%d, %s, %s, %d, %d, %d\n", d.Index, d.Name, d.UUID, d.Total/mib, (d.Total-d.Free)/mib, d.Free/mib)
	}
}
