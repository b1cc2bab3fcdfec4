package main

import (
	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
)

// procRunners lists the Ollama runners under the procfs root ("" means
// /proc), for the frames without a GPU reader: no driver lists them then,
// but /proc does, and a runner's command line names the weights blob that
// gpu.NameRunners maps to a model.
func procRunners(root string) ([]vramguard.GPUProcess, error) { return gpu.ProcRunners(root) }
