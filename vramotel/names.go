package vramotel

// The names this package reports under. The GenAI ones follow the
// OpenTelemetry semantic conventions as of their development status; they
// are declared here, not imported, so that they change only when this
// package does.

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/vramguard/vramguard/vramotel"

// Attribute keys of the GenAI and general conventions.
const (
	AttrOperationName         = "gen_ai.operation.name" // OperationTextCompletion or OperationChat
	AttrProviderName          = "gen_ai.provider.name"  // ProviderOllama
	AttrRequestModel          = "gen_ai.request.model"  // spans: as the caller named it; metrics: as /api/ps lists it
	AttrResponseFinishReasons = "gen_ai.response.finish_reasons"
	AttrServerAddress         = "server.address"
	AttrServerPort            = "server.port"
	AttrErrorType             = "error.type"        // the vramguard.Kind's String(), ErrorTypeOther without one
	AttrTokenType             = "gen_ai.token.type" // TokenTypeInput or TokenTypeOutput
	AttrUsageInputTokens      = "gen_ai.usage.input_tokens"
	AttrUsageOutputTokens     = "gen_ai.usage.output_tokens"
)

// Attribute keys of vramguard's own. Durations are in seconds, sizes in
// bytes.
const (
	AttrUnloadCause    = "vramguard.unload.cause"    // a vramguard.UnloadCause: "phase end", "guard", ...
	AttrUnloadVerified = "vramguard.unload.verified" // bool: the model was seen gone
	// AttrUnloadWasLoaded: the server listed the model during the unload
	// (UnloadReport.WasLoaded). Verified without it is an unload of a
	// model gone already: no eviction.
	AttrUnloadWasLoaded = "vramguard.unload.was_loaded"
	AttrUnloadChecks    = "vramguard.unload.checks"   // UnloadReport.Checked, "ps+runner-processes"
	AttrUnloadAttempts  = "vramguard.unload.attempts" // unload requests sent
	AttrUnloadPolls     = "vramguard.unload.polls"    // /api/ps listings read
	AttrUnloadLeased    = "vramguard.unload.leased"   // bool: a lease kept the model (or was overridden)
	AttrLeaseHolders    = "vramguard.lease.holders"   // the leases of a "lease refusal" event, as strings

	AttrReloadCause    = "vramguard.reload.cause" // a vramguard.ReloadCause; ReloadCauseNone on a first load
	AttrReloadSince    = "vramguard.reload.since" // time since the model's last use
	AttrReloadEvidence = "vramguard.reload.evidence"

	AttrLoadDuration     = "vramguard.load.duration"
	AttrTimeToFirstChunk = "vramguard.time_to_first_chunk"

	AttrDeviceIndex      = "vramguard.device.index"
	AttrMemoryHolder     = "vramguard.memory.holder"      // a MemoryHolder's Name; absent when it has none
	AttrMemoryHolderKind = "vramguard.memory.holder.kind" // a vramguard.HolderKind
	AttrVRAMNeedBytes    = "vramguard.vram.need_bytes"
	AttrVRAMFreeBytes    = "vramguard.vram.free_bytes"

	AttrAdmissionOutcome   = "vramguard.admission.outcome" // OutcomeAdmitted, OutcomeRefused or OutcomeFailed
	AttrAdmissionNeedBytes = "vramguard.admission.need_bytes"
	AttrAdmissionMadeRoom  = "vramguard.admission.made_room" // bool: Budget.MakeRoom unloaded models

	AttrPoolMember       = "vramguard.pool.member"            // a pool.Member's name
	AttrPlacementReason  = "vramguard.pool.placement.reason"  // a pool.PlaceReason: "warm", "room", "made room"
	AttrPlacementEvicted = "vramguard.pool.placement.evicted" // the models a "made room" placement unloaded
)

// Attribute values.
const (
	ProviderOllama          = "ollama"
	OperationTextCompletion = "text_completion" // a generation
	OperationChat           = "chat"
	TokenTypeInput          = "input"
	TokenTypeOutput         = "output"
	// ErrorTypeOther is the error.type of an error that carries no
	// vramguard.Kind (the library gives every error one).
	ErrorTypeOther = "_OTHER"
	// ReloadCauseNone is the reload cause of a first load.
	ReloadCauseNone = "none"

	OutcomeAdmitted = "admitted"
	OutcomeRefused  = "refused" // over the budget: KindOutOfMemory with a *vramguard.RoomError (Budget set)
	OutcomeFailed   = "failed"  // the check itself failed (an estimate, a snapshot)
)

// Span event names.
const (
	EventReload       = "reload"        // on a call's span: why its model had left
	EventLeaseRefusal = "lease refusal" // on an unload's span: leases kept the model, nothing was sent
	// EventLeaseOverride: a forced unload (ForceUnloadModel) overrode
	// leases.
	EventLeaseOverride = "lease override"
	// EventPlacement: on a call's span, the pool member (package pool)
	// the call went to and why: member, reason, device, need and free
	// bytes, evicted models.
	EventPlacement = "placement"
)

// Metric names.
const (
	MetricOperationDuration   = "gen_ai.client.operation.duration"            // histogram, s
	MetricTokenUsage          = "gen_ai.client.token.usage"                   // histogram, {token}
	MetricTimeToFirstChunk    = "gen_ai.client.operation.time_to_first_chunk" // histogram, s
	MetricModelLoads          = "vramguard.model.loads"                       // counter, {load}
	MetricModelLoadDuration   = "vramguard.model.load.duration"               // histogram, s
	MetricModelUnloadDuration = "vramguard.model.unload.duration"             // histogram, s
	MetricModelReloads        = "vramguard.model.reloads"                     // counter, {reload}
	MetricBudgetAdmissions    = "vramguard.budget.admissions"                 // counter, {admission}
	MetricVRAMWaitDuration    = "vramguard.vram.wait.duration"                // histogram, s
	MetricModelResident       = "vramguard.model.resident"                    // gauge, {model}: 1 per listed model
	MetricModelVRAM           = "vramguard.model.vram"                        // gauge, By: size_vram per listed model
	MetricDeviceMemory        = "vramguard.device.memory"                     // gauge, By: per device and holder
	MetricPoolPlacements      = "vramguard.pool.placements"                   // counter, {placement}: per member, reason and model
	MetricPoolMemberUp        = "vramguard.pool.member.up"                    // gauge, 1: 1 while a watched pool's member answers, else 0
)
