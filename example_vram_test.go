package vramguard_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vramguard/vramguard"
)

// drainingGPU is a VRAMReader for the examples: one 24 GiB device whose
// free memory grows by 4 GiB at every snapshot, as when the driver takes
// back the memory of a runner that just exited.
type drainingGPU struct {
	mu   sync.Mutex
	free uint64
}

func (g *drainingGPU) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	const gib = 1 << 30
	free := g.free
	g.free = min(g.free+4*gib, 24*gib)
	return &vramguard.VRAMSnapshot{
		Source: "simulated",
		Taken:  time.Now(),
		Devices: []vramguard.DeviceMemory{{
			Index: 0, Name: "example GPU", Total: 24 * gib, Free: free, Used: 24*gib - free,
			ProcessesKnown: true,
			Processes: []vramguard.GPUProcess{{
				PID: 4242, UsedBytes: 24*gib - free, UsedKnown: true,
				Command: "/usr/local/bin/ollama runner --port 40000", Role: vramguard.RoleOllamaRunner,
			}},
		}},
	}, nil
}

func ExampleAwaitFree() {
	const gib = 1 << 30
	gpu := &drainingGPU{free: 2 * gib}

	// Wait for room for a 9 GiB diffusion model plus 1 GiB of headroom.
	snap, err := vramguard.AwaitFree(context.Background(), gpu, vramguard.AwaitRequest{
		Device:       0,
		Bytes:        9 * gib,
		Reserve:      1 * gib,
		PollInterval: time.Millisecond,
		Timeout:      time.Minute,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("%d GiB free\n", snap.Device(0).Free/gib)

	// Asking for more than can come free in time names who holds it.
	_, err = vramguard.AwaitFree(context.Background(), &drainingGPU{}, vramguard.AwaitRequest{
		Bytes:        20 * gib,
		PollInterval: time.Hour,
		Timeout:      time.Millisecond,
	})
	var short *vramguard.RoomError
	if errors.As(err, &short) {
		fmt.Println(vramguard.KindOf(err))
		fmt.Println(short)
	}
	// Output:
	// 10 GiB free
	// timeout
	// device 0 has 0 B free of 24.0 GiB, needs 20.0 GiB; held by ollama runner (pid 4242) 24.0 GiB; stopped waiting: its timeout passed
}
