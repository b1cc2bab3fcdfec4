// Package nodes holds the prompt nodes of a diffusion pipeline: an LLM
// served by Ollama writes, refines and negates the prompts that a diffusion
// model then renders on the same GPU.
//
// Each node is a struct that embeds [vramguard.Guard], so by default the
// model is unloaded, verified, before the node returns and the diffusion
// model finds its VRAM free. Nodes return typed results and typed errors
// ([*vramguard.Error]); a failed generation never comes back disguised as a
// prompt.
//
// # Nodes
//
//   - [PromptGenerator] expands a short description into a detailed prompt
//     following a style preset ([StyleSet]).
//   - [PromptRefiner] rewrites a prompt in one to three passes.
//   - [NegativePrompt] writes the negative prompt for a positive one.
//   - [DualStreamRefiner] writes both in one generation: as a JSON object
//     that a JSON schema in the request's format asks for, from servers
//     that take one (Ollama v0.5.0 and later), otherwise in a fixed
//     "Positive:" / "Negative:" format read back by [ParseDualStream];
//     [Result].DualFormat says which.
//   - [ImagePrompter] writes a prompt from an image (a reference photo, a
//     sketch) with a vision model, following a style preset; a model that
//     cannot see fails with [vramguard.ErrNoVision].
//
// A node's zero value (with Guard.Client and Model set) is ready to use. A
// node is safe for concurrent use as long as its fields are not changed
// meanwhile; every method takes ctx first and returns a KindCanceled error
// when ctx ends, after the guard has cleaned up.
//
// # Cleaning
//
// [Clean] removes what LLMs wrap around a prompt: reasoning blocks, labels
// such as "**Prompt:**", surrounding quotes and white space. Every node runs
// its output through it (DualStreamRefiner each of its two prompts).
//
// # Styles
//
// The built-in styles (cinematic, anime, photorealistic, fantasy, abstract,
// cyberpunk, sci-fi) are text/template instructions; [LoadStyles] and
// [LoadStylesFile] add or override styles from YAML or JSON. PromptGenerator
// and ImagePrompter follow a style's instructions (for ImagePrompter the
// description is the image); NegativePrompt and DualStreamRefiner use its
// name and what it avoids.
//
// # Models
//
// [Catalog] lists the installed models, prompt-tuned ones first, for a model
// picker.
package nodes
