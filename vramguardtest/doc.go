// Package vramguardtest is vramguard's test double: an in-process fake
// Ollama server, served over real HTTP on 127.0.0.1 ([Server]), and a fake
// GPU whose memory follows that server's loads ([GPU]), so that programs
// built on vramguard (or on Ollama's own api client) are tested without
// Ollama or a GPU, as net/http programs are with net/http/httptest. It is
// the simulator vramguard tests itself with, and the one its examples run
// on when no Ollama answers.
//
// A test declares the models ([ModelConfig]: name, size, what the model
// holds on the GPU, load and token latency, capabilities such as vision,
// tools and thinking, the model_info that vramguard's EstimateModel reads,
// the replies), the server ([Config]: GPU size, keep-alive default, the
// Ollama version whose behaviour to mimic, strict memory, offload), and
// faults ([Fault]: a crash mid-stream, out of memory at load, a cut stream,
// a busy server, a stall). It builds its client with [NewClient] (or points
// vramguard.Options.Host at [Server.URL]) and Options.VRAM at [Server.GPU],
// plays other programs with [Server.APIClient] (Ollama's own client, not a
// vramguard one), runs its own code, and
// reads back what arrived: [Server.Calls] (the requests, as sent),
// [Server.Events] (requests with their keep-alives, unloads, loads,
// evictions, crashes, in order), [Server.Stats], [Server.Listed] and
// [Server.Memory].
//
// The Server speaks the subset of Ollama's HTTP API that vramguard uses:
// POST /api/generate, POST /api/chat, GET /api/ps, GET /api/tags, POST
// /api/show, GET /api/version and HEAD or GET /. Requests and replies use
// the api package's types, so the wire format is Ollama's. /api/show's
// modelfile starts, after Ollama's comment lines, with the FROM line
// naming the model's weights blob ([ModelConfig.Blob]), the path a
// runner's --model names. Runners are not processes, and no `ollama
// serve` process runs: vramguard therefore makes no process check against
// this server (UnloadReport.NoRunnerCheck says so) and verifies an unload
// from /api/ps (and the fake GPU with Options.VerifyVRAM), as for a
// remote server. Like a remote server, then, it cannot show a load another
// client started just before an unload: /api/ps lists nothing while a
// model loads, so such an unload is verified and the model appears when
// its load ends. Test that race against a real server.
//
// # Scheduler semantics
//
// The simulator reproduces the lifecycle rules of Ollama v0.17.4 that matter
// when several programs share one GPU ([Config.Version] selects the older
// behaviour where v0.6.5 differs):
//
//   - A request for a model that is not loaded loads it. The model is listed
//     by /api/ps only once loading has finished; concurrent requests share
//     one load. The final line of every request that waited for the load
//     carries load_duration, the time from its arrival to the load's one
//     end, as Ollama's handlers report it.
//   - keep_alive is sticky and last-writer-wins: a request that sends one
//     overwrites the model's setting for everybody; a request without one
//     keeps it (or uses [Config.DefaultKeepAlive] on a new load). 0 unloads
//     the model when the request ends, a negative value keeps it forever.
//   - An unload request (empty prompt, keep_alive 0) is answered at once with
//     done_reason "unload", but the model leaves /api/ps only
//     [Config.UnloadDelay] later, and only once no request holds it. While
//     other requests hold it, /api/ps lists it with expires_at in the past.
//   - An unload that arrives while the model is still loading is lost, as
//     from v0.17 on, and honoured before (see [Config.Version] and
//     [Config.HonorUnloadDuringLoad]).
//   - A client that disconnects mid-stream stops the generation and drops
//     its reference, so the model can expire.
//   - A crashed runner stays listed in /api/ps and is reloaded silently by
//     the next request.
//   - A request for another context size (num_ctx) than the model was
//     loaded with loads it again once no request holds it, as Ollama's
//     scheduler does; while others hold it, the request shares the runner.
//
// # Requests and replies
//
// Every chat line is the assistant's message: content, thinking, and the
// tool calls of a [Chunk] (given IDs "call_<8 digits>" where they have
// none, as Ollama gives each parsed tool call one; generate drops them).
// Replies come from [ModelConfig.RespondTo], which sees the whole request,
// else [ModelConfig.Respond], which sees the prompt, else a deterministic
// default: words derived from the prompt or, when the request sets a
// format, JSON split across the chunks: {"text":"..."} for "json", and
// for a JSON schema a small instance of it (strings get the words, numbers
// 0, booleans false, arrays minItems items, objects every property and
// required name).
//
// [ModelConfig.Thinking], [ModelConfig.Tools] and [ModelConfig.Vision]
// are reported as /api/show capabilities and checked like Ollama v0.17.4:
//
//   - "think": true for a model without Thinking: 400 "\"<model as sent>\"
//     does not support thinking", before loading.
//   - chat tools for a model without Tools: 400 "<full name> does not
//     support tools" ("registry.ollama.ai/library/tiny:latest ..."), before
//     loading, like scheduleRunner's capability check.
//   - a format other than absent, null, "", "json" or a JSON object: 500
//     "invalid format: <%q of the raw value>; expected \"json\" or a valid
//     JSON Schema object", once the model is loaded (llm/server.go).
//   - images, on generate or in any chat message, for a model without
//     Vision: 500 "Failed to create new sequence: failed to process
//     inputs: this model is missing data required for image input" once
//     the model is loaded, before any chunk: what the new-engine runner
//     answers for a model without vision weights. (A v0.17.4 llama-family
//     text model ignores images instead; the simulator errs so that tests
//     can see a refusal.)
//
// Refused requests count in [Stats].Requests, and a request only for
// loading (empty prompt or no messages) passes every check but the first
// two. [Server.Calls] returns what the server received, the last 64
// requests per model, unloads excepted.
//
// # Simulated GPU memory
//
// A ledger stands in for the GPU: a loading or loaded model holds its
// SizeVRAM, and [Server.Reserve] lets a test play another process that
// allocates memory on the same GPU. [Server.Memory] and [Server.Holders] are
// what an NVML query would report; [MultiGPU] splits the same ledger over
// several devices, as one server spanning several GPUs. With [Config.StrictVRAM] a load that
// does not fit fails with Ollama's out-of-memory error, or, with
// [Config.Offload], holds only what is free and runs the rest on the CPU
// (/api/ps size_vram below size).
//
// # Faults
//
// [Fault] values make a model, or only its next request, stall, crash, run
// out of memory or end its stream early, with Ollama's own error texts. See
// [Server.SetFaults] and [Server.FailNext].
//
// # Fake ComfyUI
//
// The fake ComfyUI lives beside package comfyui, in package comfyuitest;
// it allocates on this package's fake GPU (a [Server]'s ledger or a
// [PSGPU], through [Server.SetHeld] and [PSGPU.SetHeld]): two tenants, one
// device.
//
// Every goroutine and timer the Server starts is stopped and joined by
// [Server.Close].
package vramguardtest
