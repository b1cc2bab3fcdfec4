// Package wire holds the part of Ollama's HTTP API that vramguard speaks
// itself when it owns its HTTP client: the JSON body of a request
// ([NewRequest]), the error body of a status of 400 and up
// ([ReadStatusError]), the NDJSON reply of /api/generate and /api/chat
// ([Reader]), and what a vramgate at the client's address said of an
// unload it answered ([ReadGateUnload]).
//
// # Why a reader of its own
//
// The api client's reader (api.Client.Generate, .Chat) stops at a line over
// 8 MiB (v0.17 silently, v0.30 and later with bufio.ErrTooLong) and
// allocates an 8 MiB buffer per call. Ollama's done line carries the
// deprecated `context` array, every token of prompt and reply: 40 to 60 MB
// for a 10 MB prompt, which turned finished generations into cut streams.
// [Reader] checks that array and drops it as it reads, without keeping it,
// and caps everything else a line holds at [MaxLine].
//
// # Errors
//
// The package returns plain errors, in the shapes the api client returns
// where it has one, and the root package gives them their kinds: io.EOF at
// the clean end of a reply, a [*CutError] for a reply that broke off, an
// error wrapping [ErrMalformedLine] or [ErrReplyTooLarge] for a line it
// cannot use, an {"error": ...} line's text as a plain error, and
// api.StatusError or api.AuthorizationError for a failed status.
//
// Nothing here keeps state between calls; a [Reader] is not safe for
// concurrent use, the functions are.
package wire
