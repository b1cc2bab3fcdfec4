// Package vramguard lets a program use local LLMs through Ollama on a GPU it
// shares with something hungrier, such as a diffusion model, without running
// out of VRAM. Ollama keeps each model resident for five minutes by default,
// in a process the program's own allocator cannot free, so the next big CUDA
// allocation fails ("VRAM grow failed"); vramguard unloads what it used,
// verifies the memory is really back, and only then lets the next stage load.
//
// # The client
//
// [OllamaClient.GenerateStreaming] streams a generation with an explicit
// [KeepAlive] and first-chunk, idle and total timeouts that cancel the
// server-side request; a stream that ends without done:true is never a
// success. [OllamaClient.UnloadModel] returns only when the model is gone
// from /api/ps and, on a local server, no runner process serves its weights
// (a load another program started shows only there), re-sending unloads
// Ollama lost; [UnloadReport.Checked] names the checks made.
//
// # Chat, images and structured output
//
// [OllamaClient.ChatStreaming] (and [Session.Chat], [Guard.Chat]) runs a
// chat turn on the same path as a generation, with every promise above:
// messages, tools and tool calls pass through, [ChatRequest.Format] asks
// for "json" or a JSON schema, Think a thinking model's reasoning. Images
// ([GenerateRequest.Images], api.Message.Images) are checked before
// anything is sent: PNG, JPEG or WebP by their bytes ([ImageType]), at
// most [MaxImageBytes], and a model that cannot see fails with
// [ErrNoVision], from /api/show's capabilities or the server's own
// refusal.
//
// # Which call unloads what
//
// "Cuts": the call cancels this client's own generations on the model that
// have no chunk yet ([ErrUnloadedWhileLoading]); "waits": it lets them, and
// other programs' requests, end first; "kept": it does not evict a model
// this client has a generation on (EnsureFree takes such models last). Every unload is verified. "Leased"
// is what the call does with a model another client's lease keeps
// ([OllamaClient.HoldModel], or a phase of any other vramguard client on
// the host, in any process), or a lease this client holds for someone
// else ([OllamaClient.Reserve] with ReserveOptions.Model): "left" (the report's
// Leased says by whom; no failure), "refused" ([ErrLeased], KindRefused) or
// "kept" (room-making leaves it, and fails with a [RoomError] naming it
// when the room cannot be made without it). Options.Protected models are
// kept by the three room-making rows.
//
//	call               unloads                                  own     others'          leased
//	UnloadModel        the model                                cuts    waits            refused
//	ForceUnloadModel   the model                                cuts    waits            overridden
//	UnloadAll          every model listed or this client loads  cuts    waits            left (protected too)
//	Cleanup(Async)     Models; with AllModels as UnloadAll      cuts    waits            left
//	EnsureFree         fewest bytes on the device, as needed    cuts    waits            kept (protected too)
//	Budget.MakeRoom    as EnsureFree, before a load             kept    waits            kept (protected too)
//	Guard, after use   its model, if a request went out         waits   ErrHeldByOthers  left
//	Phase.End          every model the phase used               waits   waits            left (its own released)
//	Shutdown, Close    models left warm by this client          waits   waits            left (its own released)
//
// # Lifecycle
//
// A [Guard], embedded in prompt nodes (package nodes), cleans up in a defer,
// even on panic, and counts a model's users so an unload never races an
// in-flight call. A [Phase] keeps models warm across steps and ends with a
// verified unload and a hand-over of free VRAM.
//
// # VRAM truth
//
// A [VRAMReader] reads device and per-process memory: package gpu's
// (github.com/vramguard/vramguard/gpu: NVML in cgo builds, nvidia-smi
// otherwise, and the attribution of each process to an Ollama runner and
// its model), or your own. [AwaitFree] waits for room;
// [OllamaClient.EnsureFree] makes it and names who holds the memory when
// it cannot. This package needs no cgo: only package gpu links NVML.
//
// # Room-making
//
// EnsureFree, Budget.MakeRoom, Phase.End's hand-over and a pool's
// placement (through EnsureFree) make room through one owner with one victim policy. A model
// counts for the device its runner's memory is on, by the reader's
// attribution; a reader of several devices that cannot say keeps the
// model ([ErrUnattributed]) rather than evict blind. Arithmetic comes
// first: when free memory plus everything that may go cannot reach the
// need, nothing is unloaded and the call fails at once. Otherwise, in
// this order and only while the room is missing: tenants registered with
// First ([OllamaClient.RegisterTenant]: a diffusion server's cache, say),
// the fewest bytes of idle Ollama models, this client's own leased
// models, the other tenants; never a protected or leased model, nor, for
// a budget or EnsureFree with KeepInUse (a pool's), one in use.
// Every step is verified and every wait for the driver is bounded by the
// call's own timeouts. Whichever call refused, the error is one
// [RoomError] naming the need, the free bytes, the holders, the kept
// models and when to retry; EnsureRequest.DryRun answers "can I load
// this?" without unloading anything.
//
// A [Tenant] is the one registry of what gives memory back. Room-making
// asks the tenants on its device, as above; [OllamaClient.ReleaseVRAM],
// and Cleanup with Release, run every tenant's Release in registration
// order; the library's own release steps (after room-making's steps, at
// Phase.End, after a Guard's use with Release) run only the tenants on no
// device (Device -1: a function that empties an allocator's cache), so
// that ending an LLM step never empties the cache the next step renders
// from.
//
// # Errors and observability
//
// Every error is an [*Error] with a [Kind]: errors.Is(err, KindTimeout);
// causes stay reachable with errors.As. Options.Logger takes a
// *slog.Logger; [Hooks] are told one event struct each, with the context
// of the call it describes (OnCallStart and OnCallEnd, OnUnloadStart and
// OnUnloadEnd, OnAdmission, OnVRAMWait, OnFallback, OnCleanupFailed); no
// two report the same event. They are what the adapters are
// built on: package vramotel (OpenTelemetry traces and metrics) and
// package vramprom (a Prometheus collector). A program that imports
// neither compiles no OpenTelemetry or Prometheus code; [JoinHooks] lets
// several watch one client.
//
// A model that loads again soon after it left says why, in
// Generation.Reload (which Hooks.OnCallEnd sees) and an INFO log line: this client's
// unload or its budget's eviction, another program's unload, the
// keep-alive, a restart of the server, or a changed context size (see
// [ReloadCause]). It is the answer to "why does it reload every request".
//
// # Several GPUs
//
// Package pool (github.com/vramguard/vramguard/pool) puts one client over
// several Ollama servers, one per GPU (each started with
// CUDA_VISIBLE_DEVICES and its own OLLAMA_HOST): an ordinary
// [OllamaClient] whose transport routes each request to a member and whose
// VRAM reader shows member i's device as device i, so every rule of this
// package holds on it. Each load goes where the model is warm, else to the
// device with the most measured room, else where making room costs least,
// through [OllamaClient.EnsureFree]. Guards, sessions, phases and the
// nodes work on it unchanged.
//
// Each [OllamaClient] owns its state (its requests, guards, phases, its
// poller of /api/ps). The package-level variables are the error sentinels
// (ErrClosed, ...) and the three KeepAlive values ([KeepAliveUnload],
// [KeepAliveForever], [KeepAliveServerDefault]), all meant to be read and
// never assigned, and read-only tables of server messages; nothing else is
// shared between clients.
//
// # Testing
//
// Package github.com/vramguard/vramguard/vramguardtest is the test double
// this package is tested with: a fake Ollama server on loopback and a fake
// GPU ([VRAMReader]) whose memory follows its loads, with faults, the
// versions' differences and a log of what arrived. Point Options.Host at
// its URL and Options.VRAM at its GPU to test a program without Ollama or
// a GPU. Every unload names its [UnloadCause], so a test (or a dashboard)
// can tell a budget's eviction from a cleanup.
package vramguard
