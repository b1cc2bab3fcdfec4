package vramguard

import (
	"cmp"
	"log/slog"
	"net/http"
	"time"

	"github.com/ollama/ollama/api"
)

// The values NewClient takes for zero Options fields (DefaultOptions
// returns them).
const (
	defaultFirstChunkTimeout = 2 * time.Minute
	defaultIdleTimeout       = 30 * time.Second
	defaultTotalTimeout      = 10 * time.Minute
	defaultUnloadTimeout     = 30 * time.Second
	defaultPollInterval      = 50 * time.Millisecond
	defaultCleanupTimeout    = time.Minute
	defaultHost              = "http://127.0.0.1:11434"
	// defaultLoadThreshold separates a load from a reuse in the
	// load_duration Ollama reports. Ollama reports the time its handler
	// spent before the runner was ready, which is never zero: 0.5 to 5 ms
	// for a loaded model; a load of the smallest model 15 ms and up
	// (Ollama 0.17 checks a starting runner every 250 ms, so a load there
	// reports either about 15-19 ms or a quarter second and more).
	defaultLoadThreshold = 10 * time.Millisecond
	defaultReloadWindow  = 10 * time.Minute
	// defaultVRAMPollInterval is Ollama's own cadence while it waits for
	// VRAM after an unload (an nvidia-smi snapshot starts two processes).
	defaultVRAMPollInterval = 250 * time.Millisecond
)

// Timeouts bound one generation. A zero field takes the client's value (and
// the client's zero field the default, DefaultOptions); a negative field is a
// KindInvalidInput error. Every timeout cancels the HTTP request, so the
// server stops generating and drops its reference to the model.
type Timeouts struct {
	// FirstChunk bounds the wait for the first streamed chunk. It covers
	// queueing and model load: the server sends nothing before the first token.
	FirstChunk time.Duration
	// Idle bounds the gap between two chunks.
	Idle time.Duration
	// Total bounds the whole generation.
	Total time.Duration
}

func (t Timeouts) validate(op string) error {
	if t.FirstChunk < 0 || t.Idle < 0 || t.Total < 0 {
		return invalid(op, "", "negative timeout %+v", t)
	}
	return nil
}

// or returns t with its zero fields taken from d.
func (t Timeouts) or(d Timeouts) Timeouts {
	if t.FirstChunk == 0 {
		t.FirstChunk = d.FirstChunk
	}
	if t.Idle == 0 {
		t.Idle = d.Idle
	}
	if t.Total == 0 {
		t.Total = d.Total
	}
	return t
}

// Options configures an OllamaClient. The zero value is valid: it talks to
// OLLAMA_HOST (or http://127.0.0.1:11434) with the default timeouts, logs
// nothing, has no VRAM reader, no subprocess fallback, and unloads on Close
// every model it left warm.
type Options struct {
	// Host is the server's base URL ("http://gpu-box:11434") or host:port.
	// Empty: the OLLAMA_HOST environment variable (read through Getenv),
	// then http://127.0.0.1:11434 (DefaultOptions). Ignored when API is set.
	Host string
	// API is a ready client to use as is. Host and HTTPClient are then
	// ignored, except that Host, when set, is still passed to the CLI fallback.
	//
	// Without API the client reads generations' replies itself, with no
	// line limit for the context array of the done line and a cap of
	// 64 MiB on any other line (ErrReplyTooLarge). With API, generations
	// go through api.Client.Generate and keep its limits: a reply line
	// over 8 MiB ends the stream, so a prompt of a few MB, whose done
	// line carries a context array of tens of MB, fails as a KindTransient
	// ErrIncompleteStream although the server finished; and each
	// generation allocates an 8 MiB line buffer. The same holds when the
	// api client signs requests (host ollama.com, or OLLAMA_AUTH set).
	API *api.Client
	// HTTPClient is used with Host. Nil: a client with no overall timeout
	// (generations are bounded by Timeouts instead). A Transport that
	// forwards to other servers (package pool's) may name them with a
	// method Servers() []string: an unload's runner-process check then
	// looks for the `ollama serve` processes at those addresses instead of
	// at Host (see UnloadReport.NoRunnerCheck).
	HTTPClient *http.Client
	// Getenv reads the environment; nil means os.Getenv.
	Getenv func(string) string

	// Timeouts are the defaults for GenerateStreaming.
	Timeouts Timeouts
	// UnloadTimeout bounds UnloadModel's wait for verified absence.
	UnloadTimeout time.Duration
	// PollInterval is how often /api/ps is polled while verifying an unload.
	PollInterval time.Duration
	// SettleWindow, when positive, makes an unload that cannot check
	// runner processes (a remote server) wait until /api/ps has not listed
	// the model for that long, re-sending the unload whenever it appears;
	// set it longer than a load takes. Verified adds CheckSettled.
	SettleWindow time.Duration
	// CleanupTimeout bounds Cleanup, CleanupAsync and Close, which run
	// detached from the caller's cancellation.
	CleanupTimeout time.Duration
	// LoadThreshold: a generation whose reported load_duration reaches it
	// counts as a load (Generation.Loaded); zero means
	// 10 ms (see DefaultOptions).
	LoadThreshold time.Duration
	// ReloadWindow is how long after this client last used or unloaded a
	// model a new load of it is reported as a reload, with the reason the
	// model had left (Generation.Reload, an INFO log line);
	// zero means 10 minutes.
	ReloadWindow time.Duration
	// KeepModelsOnClose stops Close from unloading the models this client
	// used with a keep-alive other than KeepAliveUnload.
	KeepModelsOnClose bool

	// Fallback enables the subprocess fallback (`ollama run`) after a
	// timeout or transient failure. The CLI has no sampling flags, so it
	// honours only GenerateRequest.Think and the num_predict option, which
	// the library enforces by stopping the CLI before its text exceeds
	// num_predict approximate tokens (the larger of its words and its
	// bytes/4: at most num_predict words and 4*num_predict bytes). A
	// request with any other option is not retried through the CLI: it
	// fails with its first error's kind, joined with ErrFallbackUnsupported
	// naming the options, unless FallbackDropOptions is set. The CLI does
	// not say how a reply ended: see Generation.Fallback and
	// ErrFormatMismatch.
	Fallback bool
	// FallbackDropOptions lets the fallback run without the options the
	// CLI cannot carry (seed, temperature, top_p, stop, ...): the result
	// lists them in Generation.DroppedOptions and a warning is logged.
	FallbackDropOptions bool
	// CLIPath is the ollama binary for the fallback; empty: "ollama" on PATH.
	CLIPath string

	// VRAM, when set, reports device memory in ReleaseVRAM and lets
	// UnloadModel wait for the GPU to give the memory back (VerifyVRAM).
	// Package gpu's NewAutoReader returns one for NVIDIA devices.
	VRAM VRAMReader
	// Budget, when set, is checked before each load a generation of this
	// client would cause (see Budget). Needs VRAM, unless
	// Budget.OffWithoutGPU lets it switch itself off without one.
	Budget *Budget

	// Protected lists models this client never unloads to make room:
	// EnsureFree, Budget.MakeRoom and UnloadAll leave them (a room-making
	// call that would need one fails, naming it: a *RoomError wrapping
	// ErrProtected). They are unloaded only when asked for by name:
	// UnloadModel, Cleanup with Models, the cleanup of a guard or phase
	// that used them, and Close for those this client left warm.
	Protected []string

	// Leases configures the host-wide leases every vramguard client
	// honours (see OllamaClient.HoldModel). The zero value takes and
	// honours them in the per-user default directory.
	Leases LeaseOptions
	// VerifyVRAM makes UnloadModel also wait until device free memory has
	// risen after Ollama stopped listing the model. Needs VRAM.
	VerifyVRAM bool
	// VRAMPollInterval is the time between VRAM snapshots while EnsureFree,
	// Phase.End's hand-over and UnloadModel's VerifyVRAM wait for device
	// memory; /api/ps polls keep PollInterval. A snapshot through
	// nvidia-smi is a process, so this cadence is slower.
	// Zero means 250 ms (DefaultOptions).
	VRAMPollInterval time.Duration
	// FailOnOffload makes a generation on a model that Ollama loaded
	// partly on the CPU (see Offload) fail with a KindOutOfMemory error
	// wrapping ErrOffloaded instead of running many times slower: the
	// check is made at the first chunk, before the chunk reaches the
	// ChunkFunc; the request is canceled, no text is returned, and the
	// model is unloaded, verified (a failed unload is joined to the
	// error), before the call returns. It costs one /api/ps request per
	// generation (shared through the client's poller). At the first chunk
	// the library cannot tell who loaded the model: a generation on a
	// model another program loaded partly on the CPU fails too, and that
	// model is unloaded. Without VRAM it does nothing: a server without a
	// GPU is never flagged.
	FailOnOffload bool

	// Logger receives debug and warning events; nil discards them.
	Logger *slog.Logger
	// Hooks are called synchronously on lifecycle events; nil fields are skipped.
	Hooks Hooks
}

func (o Options) validate() error {
	const op = "new client"
	if err := o.Timeouts.validate(op); err != nil {
		return err
	}
	if o.UnloadTimeout < 0 || o.PollInterval < 0 || o.SettleWindow < 0 || o.CleanupTimeout < 0 || o.LoadThreshold < 0 || o.ReloadWindow < 0 {
		return invalid(op, "", "negative unload, poll, settle, cleanup, load-threshold or reload-window duration")
	}
	if ut := cmp.Or(o.UnloadTimeout, defaultUnloadTimeout); o.SettleWindow >= ut {
		return invalid(op, "", "settle window %v is not shorter than the unload timeout %v", o.SettleWindow, ut)
	}
	if o.Budget != nil && ((o.VRAM == nil && !o.Budget.OffWithoutGPU) || o.Budget.Device < 0) {
		return invalid(op, "", "a budget needs a VRAM reader (or OffWithoutGPU) and a device index of 0 or more")
	}
	if o.Budget != nil && o.Budget.MaxLoaded < 0 {
		return invalid(op, "", "budget's MaxLoaded %d: want 0 (no cap) or more", o.Budget.MaxLoaded)
	}
	for _, m := range o.Protected {
		if err := validModelName(op, m); err != nil {
			return err
		}
	}
	if o.VerifyVRAM && o.VRAM == nil {
		return invalid(op, "", "VerifyVRAM needs a VRAM reader")
	}
	if o.VRAMPollInterval < 0 {
		return invalid(op, "", "negative VRAM poll interval %v", o.VRAMPollInterval)
	}
	return nil
}

// DefaultOptions returns the values NewClient uses for the Options fields
// left zero: Host (http://127.0.0.1:11434), Timeouts (2 min to the first
// chunk, 30 s idle, 10 min in all), UnloadTimeout (30 s), PollInterval
// (50 ms), VRAMPollInterval (250 ms), CleanupTimeout (1 min) and
// LoadThreshold (10 ms) and ReloadWindow (10 min). The other fields are zero: no VRAM reader, no
// budget, no hooks, no logger (NewClient discards the logs).
func DefaultOptions() Options {
	o := Options{Host: defaultHost}
	o.setDefaults()
	o.Logger = nil
	return o
}

func (o *Options) setDefaults() {
	o.Timeouts = o.Timeouts.or(Timeouts{
		FirstChunk: defaultFirstChunkTimeout,
		Idle:       defaultIdleTimeout,
		Total:      defaultTotalTimeout,
	})
	if o.UnloadTimeout == 0 {
		o.UnloadTimeout = defaultUnloadTimeout
	}
	if o.PollInterval == 0 {
		o.PollInterval = defaultPollInterval
	}
	if o.VRAMPollInterval == 0 {
		o.VRAMPollInterval = defaultVRAMPollInterval
	}
	if o.CleanupTimeout == 0 {
		o.CleanupTimeout = defaultCleanupTimeout
	}
	if o.LoadThreshold == 0 {
		o.LoadThreshold = defaultLoadThreshold
	}
	if o.ReloadWindow == 0 {
		o.ReloadWindow = defaultReloadWindow
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
}
