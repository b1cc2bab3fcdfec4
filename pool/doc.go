// Package pool puts one vramguard client over several Ollama servers, one
// per GPU: Ollama's own answer for several GPUs is a server per device,
// each started with CUDA_VISIBLE_DEVICES naming one and its own
// OLLAMA_HOST.
//
// A *Pool is an ordinary *vramguard.OllamaClient (embedded), built with
// New on two things this package supplies: a transport that routes each
// request to a member (a load to the member New's rules choose, an unload
// to every member, a listing merged from all), and a VRAM reader that
// shows member i's device as device i of the client. Every lifecycle
// rule is then the root's, run once, as for one server: verified unloads,
// leases, guards, phases (a phase's hand-over names its member's device,
// Pool.Device), room-making (a placement that must make room asks the
// client's own EnsureFree on the chosen member's device), metrics and
// hooks; the reload report tells no server restart through a pool. The
// package uses the root's public API only.
//
// Where a call went is Options.OnPlace's, WithPlacements' and an INFO log
// line's; Members says which members answer and what each holds.
//
// An unload's runner-process check looks for the members' own `ollama
// serve` processes; a member on another machine turns it off, and the
// reports say so. A model another program loaded on two members is one
// model to the client, so an unload of it, room-making's included,
// unloads it on both.
package pool
