// Package ollamatest runs real Ollama servers for integration tests.
//
// It builds `ollama serve` from the Go module proxy (CPU only), caches the
// binary per version, starts it isolated on a free local port with its own
// HOME and model folder, registers two tiny models from package gguf, and
// stops the server together with every `ollama runner` it spawned.
//
// # Building
//
// Binary builds with `go install github.com/ollama/ollama@v<version>` into
// CacheDir()/<version>/ollama, once per machine: a lock file serialises
// concurrent test processes. v0.6.5 builds as is; from v0.7 on, Go module
// zips lack llama.cpp's vendor/ folder, so the build needs Debian's
// nlohmann-json3-dev and libstb-dev and a stand-in miniaudio.h (kept in
// cshim/, embedded, and passed through CGO_CPPFLAGS). scripts/install-ollama.sh
// installs the packages and builds ahead; CI runs it before the tests.
//
// # Environment
//
//   - VRAMGUARD_OLLAMA_VERSIONS: versions to test, comma-separated
//     (default "0.6.5,0.17.4").
//   - VRAMGUARD_OLLAMA_BIN: an ollama binary to run instead of building.
//   - VRAMGUARD_OLLAMA_HOST: an already running server (say, on a GPU box);
//     nothing is started or killed, and Server.External reports true.
//   - VRAMGUARD_OLLAMA_CACHE: where built binaries are cached.
//   - CI: when true, an unavailable server fails the test instead of
//     skipping it.
//
// # Lifetime
//
// Require gives a test its own server, stopped by t.Cleanup. A Pool shares
// one server per version among a package's tests and is closed by Pool.Run
// in TestMain. If the test process dies without cleaning up (a panic in a
// goroutine skips cleanups), Linux sends the server SIGTERM and the server
// stops its runners; the next Start removes the dead process's temporary
// folder.
package ollamatest
