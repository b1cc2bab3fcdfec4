// Package standin is a stand-in for upstream llama.cpp's llama-server, the
// process in which Ollama v0.30 and later run every GGUF model. The real
// binary needs CMake and a llama.cpp download, so it cannot be built where
// this module's tests run; the stand-in speaks just enough of its command
// line and HTTP API that the real Ollama server (its scheduler, keep-alive,
// unload and /api/ps, all unchanged) can load, run and unload the tiny
// models of internal/testkit/gguf, with knobs that make timing and failures
// deterministic.
//
// Build it with `go build -o DIR/build/lib/ollama/llama-server
// ./internal/testkit/standin/llama-server` and start `ollama serve` in DIR:
// Ollama v0.34.4 looks for llama-server in <exe dir>/../lib/ollama, then
// <exe dir>/build/lib/ollama, then <working dir>/build/lib/ollama
// (llm/llama_binary.go). [Run] runs the same program in-process.
//
// # What Ollama v0.34.4 asks of it
//
// Device discovery (discover/llama_server.go) first starts it with
// "--port N --host 127.0.0.1 --no-webui --offline --verbose", reads stderr
// up to the "system_info:" line and kills it; then it runs
// "--list-devices --offline --verbose", which must exit 0. The stand-in
// lists no devices, so Ollama sees a CPU and no GPU.
//
// A model runner is started (seen with tiny-a and default options) with
// "--model <OLLAMA_MODELS>/blobs/sha256-<hex> --port N --host 127.0.0.1
// --no-webui --offline -c 256 -np 1 --log-verbosity 4 --no-log-prefix
// --no-log-timestamps --load-mode none --flash-attn auto -b 512 -ub 512
// --context-shift --keep 4" (startLlamaServer in llm/llama_server.go);
// flags the stand-in does not know are skipped. Ollama polls GET /health
// every 250 ms until it answers {"status":"ok"} (503
// {"error":{"code":503,"message":"Loading model",...}} meanwhile) and takes
// the size it shows in /api/ps from the stderr line
// "load_tensors: CPU model buffer size = X MiB" (bufferSizeRegex; the
// "component:" prefix is required).
//
// Generation: /api/generate renders the prompt in Go (a model without
// tokenizer.chat_template), calls POST /tokenize, then POST /completion with
// "stream": true and reads server-sent events up to the one with
// "stop": true, whose "stop_type" "limit" becomes done_reason "length";
// then /tokenize again for the response's context. `ollama run MODEL` with
// a prompt argument or piped stdin uses /api/generate too. /api/chat (and
// the interactive `ollama run`) uses llama-server's own template: POST
// /v1/chat/completions with the messages as they are (system and user
// roles, "stream": true, n_predict, no rendered prompt) and OpenAI chunks
// back, and /apply-template plus /tokenize to drop old messages that do not
// fit. /api/embed uses /tokenize, /detokenize and POST /v1/embeddings.
//
// A JSON-schema "format" reaches the runner: /api/chat sends it as
// "response_format": {"type": "json_schema", "json_schema": {"name":
// "schema", "schema": S}} (format "json" as {"type": "json_object"}),
// /api/generate as the "json_schema" field of /completion (format "json"
// as a GBNF "grammar"). Any other format is refused by Ollama itself, after
// the model is loaded, with HTTP 500 "invalid format: ...". Images reach
// the runner too, whatever the model's capabilities: as "image_url" parts
// of a chat message, or as a /completion prompt object {"prompt_string",
// "multimodal_data"}. Tools and "think" are refused by Ollama before a load
// (HTTP 400 "... does not support tools", "\"M\" does not support
// thinking").
//
// # Behaviour
//
// Tokens are bytes (one token per byte, <s> first when special tokens are
// added), so /tokenize and /detokenize are exact inverses. Generated tokens
// are a space and a word from a fixed list, drawn from the prompt and the
// seed: the same request gives the same text. A completion stops after
// n_predict tokens (stop_type "limit") when 0 < n_predict <= EOSAfter,
// otherwise after EOSAfter tokens (stop_type "eos"); a stop word ends it
// early; without --context-shift a full context ends it with "limit". A
// prompt that does not fit in a slot's context (-c divided by -np) gets
// llama-server's 400 "exceed_context_size_error".
//
// With a JSON schema (chat "response_format" or "json_schema", completion
// "json_schema") the answer is, as under llama-server's grammar, an
// instance of the schema: the stand-in streams its minimal instance piece
// by piece (objects with their required properties, in schema order; each
// string one generated word; numbers 0, booleans false, arrays empty) and
// ends with "eos" ("stop") after the last piece unless n_predict cuts it
// short. A schema with keywords it does not handle (anyOf, $ref,
// minLength, ...) is ignored with a line on stderr, and a GBNF "grammar" is
// never interpreted: the answer is then free text.
//
// The stand-in has no multimodal projector, so, like llama-server started
// without --mmproj (as Ollama starts it for the tiny models), it refuses
// chat messages with images with HTTP 500 "image input is not supported -
// hint: if this is unexpected, you may need to provide the mmproj" (audio
// likewise) and a /completion prompt with "multimodal_data" with HTTP 400
// "Multimodal data provided, but model does not support multimodal
// requests."; these texts come from llama.cpp's source, not from a run of
// the real binary. Ollama v0.34.4 passes the runner's whole JSON error
// body on as its error message, with the runner's status code.
// TestRealOllamaChat checks chat, both schema paths and a chat image
// through the real Ollama v0.34.4.
//
// # Failures as Ollama v0.34.4 reports them
//
// Measured by TestRealOllama:
//
//   - CrashAfterTokens N: N tokens, then the stream line "an error was
//     encountered while running the model: GGML_ASSERT(vramguard stand-in:
//     crash_after_tokens = N) failed"; /api/ps still lists the model and
//     the next request reloads it.
//   - OOMAtLoad: HTTP 500 "llama-server process has terminated: exit
//     status 1: cudaMalloc failed: out of memory\nalloc_tensor_range:
//     failed to allocate CUDA0 buffer of size N\nerror loading model:
//     unable to allocate CUDA0 buffer".
//   - OOMAtLoad with OOMHealth: HTTP 500 "llama-server reported
//     out-of-memory during startup: " and the same three lines.
//   - ExitAtLoad: HTTP 500 "llama-server process has terminated: exit
//     status 1: error loading model: vramguard stand-in: exit_at_load knob
//     set".
//   - Hang "load" or "completion": no answer until the client gives up;
//     Ollama then aborts the load or cancels its runner request.
//   - A prompt longer than the context with "truncate": false: HTTP 400
//     whose message is llama-server's raw JSON error body; /api/embed with
//     "truncate": false answers 400 "the input length exceeds the context
//     length" from Ollama's own check (the default truncate shortens the
//     prompt instead).
//
// # Knobs
//
// [Knobs], read from the JSON file named by [EnvControl] when the process
// starts and again at every request, set the load time, the time per token,
// crashes, out-of-memory at load, hangs and the reported model size.
// DeviceBytes makes a runner hold real device memory through the CUDA
// driver API (opened at run time, cgo builds on Linux; [HoldDeviceMemory])
// so that a GPU check sees what NVML sees of a real runner; without a GPU
// the runner says so on stderr and loads without it.
// [WriteKnobs] replaces the file atomically. With [EnvLog] set, every
// process start, request and self-chosen exit is appended to a JSON-lines
// log that [ReadEvents] reads back, so tests can see what reached the
// runner.
package standin
