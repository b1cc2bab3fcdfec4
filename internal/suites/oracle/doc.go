// Package oracle is vramguard's lifecycle race oracle (issue #23): it draws
// random schedules from a seed, plays them against a real Ollama server and
// against the simulator configured as the same version, and holds every
// trace to the library's guarantees.
//
// # Schedules
//
// A schedule (Generate) is two to four rounds of one to three actions that
// start at random offsets in the first 400 ms of their round, where loads
// (about 300 ms on the real runners) race each other: this client's
// generations and chats (plain, guarded, asynchronous, in a phase), every
// unload path (UnloadModel, UnloadAll, EnsureFree, Cleanup, CleanupAsync,
// Close and Shutdown, a guard's cleanup, Phase.End), random cancels, other
// programs (a raw api client with any keep-alive, a bare unload as `ollama
// stop` sends it, `ollama run`, a second process using vramguard), a
// runner's SIGKILL, a server restart, and on the stand-in llama-server its
// knobs (a slow load, a crash after three tokens, out of memory at load, a
// load that hangs). The same seed and target profile give the same
// schedule; a failure prints both, and `make oracle SEED=<seed>
// VERSIONS=<version>` replays it.
//
// # What is recorded
//
// Every request is recorded with its send time and party (Send): the
// client under test's and the raw client's through an http.RoundTripper,
// the CLI's through a recording reverse proxy on loopback, the child
// process's by the child itself (ChildTransport: it reaches the server
// directly, since its runner check is tied to the process that listens at
// its client's port, and a proxy is not the server). Verified unloads come
// from Hooks.OnUnloadEnd (the child prints its own). A watcher
// looks at the server every 15 ms: /api/ps and
// the runner processes serving each model's weights (Obs).
//
// # The guarantees (Check)
//
//   - A verified model stays gone: absent from /api/ps and with no runner,
//     for a window longer than the slowest load (Window), unless a load was
//     sent after the verdict's last unload request (causality: a load that
//     began before it must have been seen). On a local server every
//     verdict rests on the process check.
//   - Every error has a kind; none is internal or invalid input (the oracle
//     sends valid input); the oracle's cancel comes back as KindCanceled
//     carrying its cause; an out-of-memory load is not retryable; a
//     generation whose stream reached done:true is never reported failed;
//     an unload never gives up on a model no other call used meanwhile.
//   - Every call returns within its timeouts plus a margin; a round that
//     outlives them by a minute is a hang, reported with every goroutine.
//   - When Close returns nil, no model it kept warm is resident; once every
//     party has finished and the other programs have unloaded their models,
//     nothing is; no goroutine the schedule started is left (each run is
//     labeled for the profiler, so schedules can run side by side).
//
// Two patterns are the server's and are counted apart (Violation.Known),
// not failed: a load that showed neither a listing nor a runner until the
// library's settle window had passed (queued in Ollama's scheduler, or a
// runner that started late on a loaded machine), and a server that
// stopped answering unload requests.
//
// Probe measures, with a raw client, what a server does by itself in the
// races the library works around; TestServerBehaviour holds that to the
// README's compatibility table.
//
// The simulator's runs are held to the same rules and compared with the
// real server's (Compare): the differences are counted, not failed, and
// RELIABILITY.md lists them.
package oracle
