// Package benchreal holds vramguard's benchmarks against real Ollama servers
// (the versions of internal/testkit/ollamatest, CPU only, with the two tiny
// models of internal/testkit/gguf): the verified unload against a
// hand-written bare unload, and the original prompt workflow per call
// against a phase.
//
// It has no code of its own; run the benchmarks with `make bench`
// (scripts/bench.sh), which records the figures of BENCHMARKS.md. Without a
// server they skip, saying how to get one (with CI=true that is a failure).
package benchreal
