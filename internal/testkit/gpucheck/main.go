// Command gpucheck proves, on a machine with an NVIDIA GPU, that vramguard's
// VRAM figures are the driver's truth: it reads the device through NVML and
// nvidia-smi and compares them, starts the real Ollama server with the
// stand-in llama-server holding a known amount of device memory per model,
// and over many rounds unloads that runner with UnloadModel (VerifyVRAM),
// EnsureFree and a plain unload followed by AwaitFree, timing each against
// a 10 ms NVML poll of its own and naming the holder (PID and model) through
// gpu.NameRunners. It writes gpucheck.json and gpucheck.txt to -out.
//
// It needs no Go at run time: scripts/gpu-build.sh builds it, the stand-in
// (with cgo, for the CUDA driver API) and copies the cached Ollama binary;
// scripts/gpu-check.sh runs it. Without a GPU it still starts Ollama and the
// stand-in and runs a few rounds on the CPU path (the stand-in says it holds
// nothing), then reports "no NVIDIA GPU: skipped" and exits 0.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.Ollama, "ollama", ".gpu/ollama", "the ollama binary (v0.30 or later: runs models in llama-server)")
	flag.StringVar(&cfg.OllamaVersion, "ollama-version", "0.34.4", "the version of -ollama")
	flag.StringVar(&cfg.Standin, "standin", ".gpu/llama-server", "the stand-in llama-server, built with cgo")
	flag.StringVar(&cfg.Out, "out", os.Getenv("OUT"), "folder for gpucheck.json and gpucheck.txt (default $OUT, else gpucheck-out)")
	flag.IntVar(&cfg.Rounds, "rounds", 30, "load/unload rounds on a GPU (cycling UnloadModel, EnsureFree, AwaitFree)")
	flag.IntVar(&cfg.CPURounds, "cpu-rounds", 3, "rounds without a GPU (plumbing only)")
	flag.Int64Var(&cfg.DeviceBytes, "device-bytes", 2<<30, "device memory each runner holds")
	flag.DurationVar(&cfg.Poll, "poll", 10*time.Millisecond, "NVML poll interval of the driver-free timer")
	flag.DurationVar(&cfg.Budget, "budget", 4*time.Minute, "the whole check's time limit; rounds stop early to stay inside it")
	flag.StringVar(&cfg.SMI, "smi", "", "nvidia-smi executable (default: on PATH)")
	flag.BoolVar(&cfg.ForceCPU, "cpu", false, "take the CPU path even where there is a GPU")
	flag.Parse()
	if cfg.Out == "" {
		cfg.Out = "gpucheck-out"
	}
	// The server runs in a folder of its own: relative paths would miss.
	for _, p := range []*string{&cfg.Ollama, &cfg.Standin, &cfg.Out} {
		if abs, err := filepath.Abs(*p); err == nil {
			*p = abs
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, cfg.Budget+30*time.Second)
	defer cancel()

	rep := run(ctx, cfg, os.Stderr)
	if err := rep.write(cfg.Out); err != nil {
		fmt.Fprintln(os.Stderr, "gpucheck:", err)
		os.Exit(1)
	}
	fmt.Print(rep.text())
	if !rep.Passed {
		os.Exit(1)
	}
}
