// Package comfyuitest provides a fake ComfyUI for tests, as
// net/http/httptest provides servers for net/http: [NewServer] starts one
// on 127.0.0.1 that holds its memory on the fake GPU of package
// vramguardtest (a [*vramguardtest.Server]'s ledger or a
// [*vramguardtest.PSGPU]), so that a program that shares a GPU between
// Ollama and ComfyUI is tested, with package comfyui or without it,
// against both fakes on one device.
//
// It follows ComfyUI as it runs today (DynamicVRAM, comfy-aimdo: weights
// outside torch's pool, resident until /free) by default, and the older
// ModelPatcher memory management of ComfyUI 0.3.64 as an option
// ([Config].Mode). Each behaviour names its source; no real ComfyUI was
// run to check it. See [Server].
package comfyuitest
