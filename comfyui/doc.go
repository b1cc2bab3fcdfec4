// Package comfyui brings ComfyUI, the other tenant of a GPU that Ollama
// shares with a diffusion pipeline, under vramguard's guarantees. ComfyUI
// keeps every model it loaded cached in VRAM until told otherwise, so the
// LLM load after a render spills to the CPU or fails; and its POST /free
// answers at once, before anything is freed.
//
// A [Client] speaks the parts of ComfyUI's HTTP API a hand-off needs:
// [Client.SystemStats], [Client.Queue], [Client.Submit] and [Client.Wait]
// (the /ws messages of the client's own prompts, /history otherwise),
// [Client.Interrupt], and [Client.Free], whose [Receipt] says what came
// back as measured, never more.
//
// # ComfyUI's semantics this package relies on
//
// Read in ComfyUI's server.py, main.py, execution.py and
// comfy/model_management.py at commit a125cd84 (0.3.64):
//
//   - POST /free {"unload_models", "free_memory"} only sets flags and
//     answers 200 at once. The prompt worker applies them after the
//     prompt it is running, at once when idle; nothing says when it is
//     done. unload_models unloads every model and empties torch's cache;
//     free_memory (which implies it) also drops the node cache. Memory
//     that custom nodes hold outside ComfyUI's model management survives.
//     So Free reads the memory until it settles, and waits for a running
//     prompt only when asked ([FreeRequest].Wait); otherwise it says
//     [OutcomePending].
//   - GET /system_stats' vram_free adds ComfyUI's own reserved-but-unused
//     cache to the driver's free memory: another process cannot use it.
//     Free reads torch_vram_total (torch's pool) and torch_vram_free
//     instead, and the GPU reader for the driver's view. The route answers
//     slowly while the worker unloads: a late answer is [ErrBusy]
//     (KindTransient), a reading skipped, not a server that is down.
//   - A prompt's WebSocket messages go only to the socket of the client_id
//     it was submitted with, and a new socket with the same id replaces
//     the old one: a Client keeps one socket, shared by its waiters.
//     `executing` with node null ends a prompt, after its history is
//     written.
//   - An invalid graph is a 400 whose body names the error's type and,
//     per node, what failed: [PromptError], KindInvalidInput.
//
// # Room-making and holders
//
// [Client.Tenant] is ComfyUI as a vramguard.Tenant: registered with
// OllamaClient.RegisterTenant, room-making (EnsureFree, a budget with
// MakeRoom, Phase.End's hand-over) frees ComfyUI when a load needs its
// memory, before Ollama's idle models or after them
// ([TenantOptions].First), and verifies the release on the device like an
// unload. While ComfyUI's queue is busy it waits for it to drain, under
// the call's ctx, or refuses with a retry-after ([TenantOptions].WhileBusy):
// a load that needs a running render's memory waits for the render or is
// refused, and one that fits beside it goes ahead.
//
// [Client.Reader] names ComfyUI's process ([HolderName]) in a GPU
// reader's snapshots, so that DeviceMemory.Holders, a budget's refusal,
// vramwatch and the metrics adapters name ComfyUI as a holder.
//
// Tests run against vramguardtest's fake ComfyUI (comfyuitest.NewServer),
// which follows the same source; no real ComfyUI runs in this project's CI.
package comfyui
