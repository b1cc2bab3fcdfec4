// Package reliability holds vramguard's fault-injection scenarios: every
// failure a network or an Ollama server can produce, played by
// internal/testkit/faultproxy between a client and a server (the simulator and the
// real Ollama servers of internal/testkit/ollamatest), and checked for the error
// kind, the time to the error, the cleanup, goroutines and connections
// left, and models left resident.
//
// The package has tests only; RELIABILITY.md at the module root records
// their figures. The real servers follow internal/suites/integration's policy:
// outside CI the cases skip when no server can be built, with CI=true that
// is a failure.
package reliability
