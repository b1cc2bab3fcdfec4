// Package gguf writes tiny random-weight llama models in the GGUF format, so
// that tests can run a real Ollama server without downloading a model.
//
// The files are deterministic: the same Params give the same bytes, hence
// the same digest. They are GGUF version 3 with 32-byte alignment, F32
// tensors only, and a vocabulary of <unk>, <s>, </s> and the 256 byte
// tokens. The weights are arranged so that </s> is never sampled: a
// generation always runs for exactly num_predict tokens.
//
// # Sizes
//
// Small (about 115 KB) and Large (about 470 KB) are the standard presets; two
// models of different sizes let tests tell loads and swaps apart. Both load
// in well under a second on a CPU and use no VRAM on a CPU-only server.
//
// # Registering
//
// Register uploads a model with CreateBlob and creates it with
// CreateRequest.Files, which Ollama v0.6.5 and later accept.
package gguf
