// Package vramguard lets a program use local LLMs through Ollama on a GPU it
// shares with something hungrier, such as a diffusion model, without running
// out of VRAM. Ollama keeps each model resident for five minutes by default,
// in a process the program's own allocator cannot free, so the next big CUDA
// allocation fails ("VRAM grow failed"); vramguard unloads what it used,
// verifies the memory is really back, and only then lets the next stage load.
//
// # The client
//
// [OllamaClient] wraps Ollama's own Go client. [OllamaClient.GenerateStreaming]
// streams a generation with an explicit [KeepAlive] and three timeouts
// (first chunk, idle, total) that cancel the server-side request, and returns
// failures as [*Error] values whose [Kind] says what happened: a stream that
// ends without the server's done:true is never a success.
// [OllamaClient.UnloadModel] returns only when the server no longer lists the
// model and, on a server on this machine, no runner process serves its
// weights (a load another program started shows only there), re-sending the
// unload when Ollama lost it (it does when the unload arrives during a load);
// [UnloadReport.Checked] names the checks made. A load this client started
// is canceled rather than raced ([ErrUnloadedWhileLoading]); on a remote
// server, [Options.SettleWindow] watches /api/ps for longer than a load.
// [OllamaClient.Cleanup] and [OllamaClient.CleanupAsync] unload and release
// memory under a detached, bounded context; [OllamaClient.Shutdown] and
// [OllamaClient.Close] join every cleanup still running.
//
// # Which call unloads what
//
// Every unload below is verified as [OllamaClient.UnloadModel] verifies
// (gone from /api/ps and, on a local server, from the process table).
// "Cuts" means the call cancels this client's own generations on the model
// that have no chunk yet; "waits" that it lets them, and other programs'
// requests, end first.
//
//	call                        unloads                                   own loads   others' requests
//	UnloadModel                 the model                                 cuts        waits
//	UnloadAll                   every model listed or this client loads   cuts        waits
//	Cleanup, CleanupAsync       Models, and with AllModels as UnloadAll   cuts        waits
//	EnsureFree                  the largest Ollama models, until enough   cuts        waits
//	                            is free (all of them only on request,
//	                            without a VRAM reader)
//	Guard, after use            its model, if a request went out          waits       sends the unload, reports
//	                                                                                  ErrHeldByOthers
//	Phase.End                   every model the phase used                waits       waits
//	Shutdown, Close             models used with a keep-alive other       waits       waits
//	                            than KeepAliveUnload
//	a generation with           nothing: the server unloads it when
//	KeepAliveUnload             the request ends (not verified)
//
// # Lifecycle
//
// A [Guard], embedded in prompt nodes (package nodes), runs LLM work and
// cleans up in a defer, even when the work panics, and counts concurrent
// users of a model so an unload never races an in-flight call. A [Phase]
// keeps models warm across a run of steps with a bounded keep-alive and ends
// with a verified unload and a hand-over of free VRAM ([OllamaClient.EnsureFree]).
//
// # VRAM truth
//
// A [VRAMReader] reads device and per-process memory from the GPU: NVML
// through go-nvml in cgo builds on Linux, nvidia-smi otherwise, or a reader
// of your own. [AwaitFree] waits for room; [OllamaClient.EnsureFree] makes it,
// evicting the largest Ollama models first, and names who holds the memory
// when it cannot.
//
// # Errors
//
// Every error is an [*Error] with an Op, a Model and a [Kind]; match kinds
// with errors.Is(err, vramguard.KindTimeout) and causes with errors.As
// (api.StatusError, context.DeadlineExceeded, nvml.Return).
//
// # Observability
//
// Options.Logger takes a *slog.Logger (nil discards) and Options.Hooks takes
// callbacks for loads, reuses, unload requests, verified evictions, cleanup
// failures, fallbacks and VRAM waits, each taking one struct. There is no
// package-level state.
package vramguard
