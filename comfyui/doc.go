// Package comfyui brings ComfyUI, the other tenant of a GPU that Ollama
// shares with a diffusion pipeline, under vramguard's guarantees. ComfyUI
// keeps the models it loaded in VRAM until told otherwise (today's
// DynamicVRAM indefinitely, giving nothing back to another program while
// idle), so the LLM load after a render spills to the CPU or fails; and
// its POST /free answers at once, before anything is freed.
//
// A [Client] speaks the parts of ComfyUI's HTTP API a hand-off needs:
// [Client.SystemStats], [Client.Queue], [Client.Submit] and [Client.Wait]
// (the /ws messages of the client's own prompts, /history otherwise),
// [Client.Interrupt], and [Client.Free], whose [Receipt] says what came
// back as measured on the device, never more.
//
// # ComfyUI's semantics this package relies on
//
// Read in ComfyUI's server.py, main.py, execution.py and
// comfy/model_management.py at commit a125cd84 (0.3.64), and in
// comfy-aimdo's sources with ComfyUI's 2026 main.py, server.py,
// comfy/cli_args.py and comfy/model_management.py (0.18 and later; the
// project's FIELD_NOTES §8 and §9):
//
//   - Two memory managements ([Mode]): DynamicVRAM, on by default on
//     NVIDIA since 0.18, holds the weights outside torch's allocator, so
//     /system_stats' torch_vram_total and torch_vram_free read about 0 for
//     an idle ComfyUI holding a 12 GB model, and keeps them resident until
//     /free; ModelPatcher (0.3.64, or --disable-dynamic-vram, --highvram,
//     --gpu-only, --novram, --cpu) holds them in torch's pool. So ComfyUI
//     is measured from the device (its process by PID, else the device's
//     free memory with the other holders accounted for), with the torch
//     pool a secondary view that never makes a "freed" alone;
//     [SystemStats.Mode] and [Receipt.Mode] say which mode it runs.
//   - POST /free {"unload_models", "free_memory"} only sets flags and
//     answers 200 at once. The prompt worker applies them after the
//     prompt it is running, at once when idle; nothing says when it is
//     done. unload_models unloads every model (on every device, today);
//     free_memory (which implies it) also drops the node cache. Memory
//     that custom nodes hold outside ComfyUI's model management survives.
//     So Free reads the memory until it settles, and waits for a running
//     prompt only when asked ([FreeRequest].Wait); otherwise it says
//     [OutcomePending].
//   - GET /system_stats' vram_free adds ComfyUI's own reserved-but-unused
//     cache to the driver's free memory: another process cannot use it,
//     and Free does not read it. The route answers slowly while the
//     worker unloads: a late answer is [ErrBusy] (KindTransient), a
//     reading skipped, not a server that is down. Its argv shows the
//     flags ComfyUI was started with ([SystemStats.GBFlag]:
//     --reserve-vram, the one real partition, and --vram-headroom).
//   - A prompt's WebSocket messages go only to the socket of the client_id
//     it was submitted with, and a new socket with the same id replaces
//     the old one: a Client keeps one socket, shared by its waiters.
//     `executing` with node null ends a prompt, after its history is
//     written.
//   - An invalid graph is a 400 whose body names the error's type and,
//     per node, what failed; today's ComfyUI also refuses a client
//     prompt_id that is not a canonical lowercase UUID (400) and one it
//     has already (409): [PromptError], KindInvalidInput. Submit sends a
//     prompt_id of its own making, so that a prompt is cancelled by id
//     (POST /api/jobs/{id}/cancel, else /queue's delete and /interrupt)
//     when the ctx of Run or Wait ends.
//   - A prompt that cannot get memory fails with torch's OutOfMemoryError
//     (ModelPatcher) or comfy-aimdo's RuntimeError "VRAM grow failed: N
//     bytes" (DynamicVRAM): [ExecutionError], KindOutOfMemory, with the
//     bytes.
//
// # Room-making and holders
//
// [Client.Tenant] is ComfyUI as a vramguard.Tenant: registered with
// OllamaClient.RegisterTenant, room-making (EnsureFree, a budget with
// MakeRoom, Phase.End's hand-over) frees ComfyUI when a load needs its
// memory, before Ollama's idle models or after them
// ([TenantOptions].First), and verifies the release on the device like an
// unload. Its size is what the device shows ComfyUI holding. While
// ComfyUI's queue is busy it waits for it to drain, within the call's own
// bound, or refuses with a retry-after ([TenantOptions].WhileBusy): a
// load that needs a running render's memory waits for the render (and
// ends with a *RoomError of KindTimeout and a [WaitError] naming the
// prompt when the bound passes first) or is refused, and one that fits
// beside it goes ahead.
//
// [Client.Reader] names ComfyUI's process ([HolderName]) in a GPU
// reader's snapshots, so that DeviceMemory.Holders, a budget's refusal,
// vramwatch and the metrics adapters name ComfyUI as a holder.
//
// Tests run against the fake ComfyUI of package comfyuitest (beside this
// one), which follows the same sources in both modes; no real ComfyUI
// runs in this project's CI.
package comfyui
