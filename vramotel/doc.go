// Package vramotel reports what a vramguard client does to the GPU as
// OpenTelemetry traces and metrics. A model that stays in VRAM, reloads
// after another program evicted it, or waits for memory shows in a trace
// next to the generation it slowed, and in metrics next to its peers.
//
// It is built only on [vramguard.Hooks], as otelhttp is built on net/http:
// a program that does not import it compiles no OpenTelemetry.
//
//	inst, err := vramotel.New(vramotel.Config{VRAM: reader}) // the global providers
//	...
//	defer inst.Close()
//	c, err := vramguard.NewClient(vramguard.Options{VRAM: reader, Hooks: inst.Hooks()})
//	...
//	defer c.Close()
//	defer inst.Watch(c)() // stops before c closes
//
// # Spans
//
// Each generation or chat is a client span "{gen_ai.operation.name}
// {model}" ("text_completion llama3.2", "chat llama3.2") with the GenAI
// attributes (provider "ollama", model, server, token usage) and
// vramguard's own: the time to the first chunk, the load's duration and,
// for a reload, why the model had left. A failed call has status Error and
// error.type, the [vramguard.Kind] of its error ("model crash", "out of
// memory"). Under it, as the call's context reaches them:
//
//   - "load {model}": the model's load, from the call's start for the
//     load_duration the server reported;
//   - "budget admission {model}": Options.Budget's check of the load;
//   - "vram wait": a wait for free device memory;
//   - "unload {model}": an unload (every cause, also outside calls), with
//     its cause, whether it was verified, the checks, the requests sent
//     and the /api/ps polls; a lease that kept the model adds the event
//     "lease refusal" naming the holders;
//   - the event "reload" on the call's span: why a model loaded again;
//   - the event "placement" on the call's span, for a pool
//     ([pool.New], with [Instrumentation.Place] as its OnPlace): the
//     member the call went to, why ("warm",
//     "room", "made room"), the need and free bytes, and the models
//     unloaded to make room.
//
// # Metrics
//
// The GenAI client metrics (gen_ai.client.operation.duration,
// gen_ai.client.token.usage, gen_ai.client.operation.time_to_first_chunk)
// and vramguard's: loads, reloads and their causes, load and unload
// durations, budget admissions, VRAM waits, a pool's placements by member
// and reason, and, at collection time, the models a watched client's
// server holds and, for a pool client, whether each member answers
// ([Instrumentation.Watch]), and each device's memory by holder
// ([Config].VRAM). The names and attribute keys
// are this package's constants: the GenAI conventions are still in
// development, and a dashboard should not break when they move. Metrics
// name a model as /api/ps lists it ("llama3.2:latest",
// vramguard.NormalizeModelName), so that a call's series and the residency
// gauge of one model match; spans name it as the caller did. Durations are
// in seconds, with the bucket boundaries the GenAI conventions recommend.
package vramotel
