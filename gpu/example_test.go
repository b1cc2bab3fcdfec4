package gpu_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
	"github.com/vramguard/vramguard/vramguardtest"
)

// The weights blobs of the examples' models, as `ollama show --modelfile`
// names them in its FROM line.
const (
	exampleBlobA = "sha256:6a0746a1ec1aef3e7ec53868f220ff6e389f6f8ef87a01d77c96807de94ca2aa"
	exampleBlobB = "sha256:e8ad13eff07a78d89926e9e8b882317d082ef5bf9768ad7b50fcdbbcd63748de"
)

// startNamingSim starts the simulator with tiny-a loaded and tiny-b
// installed.
func startNamingSim() (*vramguardtest.Server, *vramguard.OllamaClient) {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{
		{Name: "tiny-a", Blob: exampleBlobA, Size: 5 << 30},
		{Name: "tiny-b", Blob: exampleBlobB, Size: 3 << 30},
	}})
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), KeepModelsOnClose: true})
	if err != nil {
		log.Fatal(err)
	}
	_, err = c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "tiny-a", Prompt: "hi"},
		vramguard.KeepAliveForever, nil)
	if err != nil {
		log.Fatal(err)
	}
	return s, c
}

func ExampleNameRunners() {
	s, c := startNamingSim()
	defer s.Close()
	defer c.Close()

	// A snapshot as the NVML or nvidia-smi reader makes it: each runner's
	// command line names its weights blob, not its model.
	snap := &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{
		Index: 0, ProcessesKnown: true,
		Processes: []vramguard.GPUProcess{
			{PID: 4242, UsedBytes: 5 << 30, UsedKnown: true, Role: vramguard.RoleOllamaRunner, Blob: exampleBlobA,
				Command: "/usr/lib/ollama/llama-server --model /root/.ollama/models/blobs/sha256-6a07... --port 40125"},
			{PID: 4343, UsedBytes: 3 << 30, UsedKnown: true, Role: vramguard.RoleOllamaRunner, Blob: exampleBlobB,
				Command: "/usr/lib/ollama/llama-server --model /root/.ollama/models/blobs/sha256-e8ad... --port 40126"},
		},
	}}}
	if err := gpu.NameRunners(context.Background(), c, snap); err != nil {
		log.Fatal(err)
	}
	for _, p := range snap.Devices[0].Processes {
		fmt.Printf("pid %d serves %s\n", p.PID, p.Model)
	}
	// Output:
	// pid 4242 serves tiny-a:latest
	// pid 4343 serves tiny-b:latest
}

func ExampleFindOrphans() {
	// A snapshot as NewAutoReader's reader takes it: a runner holds
	// 16 GiB, and Ollama's /api/ps lists no model.
	snap := &vramguard.VRAMSnapshot{Devices: []vramguard.DeviceMemory{{
		Index: 0, Name: "example GPU", Total: 24 << 30, Free: 8 << 30, Used: 16 << 30,
		ProcessesKnown: true,
		Processes: []vramguard.GPUProcess{{
			PID: 4242, UsedBytes: 16 << 30, UsedKnown: true,
			Command: "/usr/local/bin/ollama runner --port 40000", Role: vramguard.RoleOllamaRunner,
		}},
	}}}

	for _, p := range gpu.FindOrphans(snap, 0) {
		fmt.Printf("orphan: pid %d, %d GiB\n", p.PID, p.UsedBytes>>30)
		// gpu.KillProcess(p.PID) would end it; the library never does.
	}
	// Output:
	// orphan: pid 4242, 16 GiB
}

func ExampleClassifyCommand() {
	fmt.Println(gpu.ClassifyCommand([]string{"/usr/local/bin/ollama", "serve"}))
	fmt.Println(gpu.ClassifyCommand([]string{"/usr/local/bin/ollama", "runner", "--port", "40000"}))
	fmt.Println(gpu.ClassifyCommand([]string{"python3", "main.py"}))
	// Output:
	// ollama server
	// ollama runner
	// other
}

func ExampleNewAutoReader() {
	ctx := context.Background()
	r, err := gpu.NewAutoReader(ctx, gpu.ReaderOptions{})
	if err != nil {
		// No NVML and no nvidia-smi: run without GPU truth.
		fmt.Println("no GPU reader:", vramguard.KindOf(err))
		return
	}
	defer r.Close() // shuts NVML down when that is what it opened
	snap, err := r.Snapshot(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, d := range snap.Devices {
		fmt.Printf("GPU %d %s: %d MiB free (%s)\n", d.Index, d.Name, d.Free>>20, r.Source())
	}
}

func ExampleNewSMIReader() {
	r, err := gpu.NewSMIReader(gpu.ReaderOptions{SMITimeout: 5 * time.Second})
	if err != nil {
		fmt.Println(vramguard.KindOf(err)) // unavailable: nvidia-smi is not on PATH
		return
	}
	defer r.Close()
	snap, err := r.Snapshot(context.Background())
	if err == nil {
		fmt.Println(len(snap.Devices), "GPUs")
	}
}

func ExampleNewNVMLReader() {
	r, err := gpu.NewNVMLReader(gpu.ReaderOptions{})
	if err != nil {
		fmt.Println(vramguard.KindOf(err)) // unavailable: no driver, or a build without cgo
		return
	}
	defer r.Close()
	snap, err := r.Snapshot(context.Background())
	if err == nil {
		fmt.Println(len(snap.Devices), "GPUs")
	}
}

func ExampleClassifyCommand_generations() {
	for _, argv := range [][]string{
		{"/usr/local/bin/ollama", "runner", "--model", "/root/.ollama/models/blobs/sha256-6a07", "--port", "40123"},
		{"/usr/lib/ollama/llama-server", "--model", "/root/.ollama/models/blobs/sha256-6a07", "--port", "40125"},
		{"/usr/lib/ollama/llama-server", "--list-devices"},
		{"llama-server", "-m", "model.gguf"},
	} {
		fmt.Println(gpu.ClassifyCommand(argv))
	}
	// Output:
	// ollama runner
	// ollama runner
	// ollama discovery
	// other
}

// Without a GPU, the runners this machine runs, from /proc, each with the
// weights it serves; NameRunners turns those into model names.
func ExampleProcRunners() {
	runners, err := gpu.ProcRunners("")
	if err != nil {
		log.Fatal(err) // no procfs here
	}
	for _, r := range runners {
		fmt.Println(r.PID, r.Blob, r.Orphaned)
	}
}
