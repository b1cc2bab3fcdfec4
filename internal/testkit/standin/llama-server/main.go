// Command llama-server is the stand-in for upstream llama.cpp's llama-server
// that Ollama v0.30 and later run models in; see package
// github.com/vramguard/vramguard/internal/testkit/standin.
package main

import (
	"os"

	"github.com/vramguard/vramguard/internal/testkit/standin"
)

func main() {
	os.Exit(standin.Main(os.Args[1:], os.Stdout, os.Stderr))
}
