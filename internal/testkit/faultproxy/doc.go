// Package faultproxy is a fault-injecting HTTP proxy for reliability tests:
// it sits between a client and an Ollama server (the simulator of package
// sim or a real one from package ollamatest) and, per request, passes the
// exchange through or breaks it the way networks and servers break.
//
// # Faults
//
// A [Fault] can reset the connection (TCP RST) after a number of response
// bytes or NDJSON lines, stall before the first byte or between lines,
// answer by itself (500 "llama runner process has terminated", 503 busy,
// garbage, any status and body), inject bytes into the stream (such as a
// line longer than the Ollama client's 8 MiB limit), drop the final
// done:true line, or delay a request (such as GET /api/ps) before it is
// forwarded. [Proxy.GoAway] stops listening altogether, so that the next
// call finds nothing at the address, and [Proxy.Resume] listens again.
//
// Faults are programmed per request: [Proxy.Push] queues faults for a path
// (each is used by one request), and a rule function ([Options.Rule],
// [Proxy.SetRule]) decides for requests that no queued fault claims.
//
// # Cancellation
//
// The proxy forwards a request under a context that ends when the client
// goes away, when a fault cuts the exchange, or when the proxy closes, so
// the upstream server sees the request canceled exactly as it would see a
// direct client give up (Ollama logs 499 and drops its reference to the
// model).
//
// # Lifetime
//
// A Proxy is safe for concurrent use. [Proxy.Close] closes its listener and
// every client and upstream connection, and returns once every handler has
// returned, so a test can check with goleak that nothing is left.
// [Proxy.Stats] and [Proxy.WaitFor] expose counters (requests, faults
// injected, connections open on either side) for leak checks.
package faultproxy
