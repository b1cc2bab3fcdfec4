package comfyuitest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vramguard/vramguard/vramguardtest"
)

// Defaults used where a [Config] field is zero.
const (
	// DefaultVersion is the ComfyUI release the fake reports as
	// system.comfyui_version in DynamicVRAM mode: the release of the log
	// that started this project (FIELD_NOTES §9).
	DefaultVersion = "0.25.0"
	// ModelPatcherVersion is the release it reports in ModelPatcher
	// mode: the source §8 of FIELD_NOTES was read in.
	ModelPatcherVersion = "0.3.64"
	// DefaultStepTime is the time a fake sampler step takes.
	DefaultStepTime = 10 * time.Millisecond
	// DefaultContextBytes is the fake process's CUDA context.
	DefaultContextBytes = 256 << 20
	// DefaultCommand is the command the fake GPU lists the process with.
	DefaultCommand = "python main.py"
)

// Mode is the memory management a fake ComfyUI follows.
type Mode uint8

const (
	// DynamicVRAM is ComfyUI as it runs today on NVIDIA (0.18 and later,
	// March 2026; comfy-aimdo): weights outside torch's allocator, kept
	// resident until /free or until its own prompt needs the room. See
	// [Server] for what the fake copies, and from where.
	DynamicVRAM Mode = iota
	// ModelPatcher is ComfyUI 0.3.64 (October 2025), and today's ComfyUI
	// started with --disable-dynamic-vram, --highvram, --gpu-only,
	// --novram or --cpu: models in torch's pool, torch's cache emptied
	// after prompts.
	ModelPatcher
)

func (m Mode) String() string {
	switch m {
	case DynamicVRAM:
		return "DynamicVRAM"
	case ModelPatcher:
		return "ModelPatcher"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// DynamicVRAMHeadroom is what a fake ComfyUI in DynamicVRAM mode keeps
// free on the device, besides Config.VRAMHeadroom, when it allocates for
// its own prompt (FIELD_NOTES §9: "about 256 MiB plus --vram-headroom
// GB", comfy/model_management.py): a test that sizes a fake device for a
// render counts it.
const DynamicVRAMHeadroom = 256 << 20

// pagedSlowdown is how much slower a sampler step runs with all of its
// model's weights streamed from host RAM instead of resident (a step
// with a fraction f paged takes StepTime × (1 + pagedSlowdown × f)). The
// figure is made up: FIELD_NOTES §9 says only "slower steps".
const pagedSlowdown = 3

// comfyGCInterval is the prompt worker's gc_collect_interval (main.py):
// after a prompt, torch's cache is handed back to the driver at most this
// often.
const comfyGCInterval = 10 * time.Second

// comfyMaxEvents bounds a fake ComfyUI's event log.
const comfyMaxEvents = 4096

// Device is the fake GPU a fake ComfyUI allocates on: a
// [*vramguardtest.Server]'s ledger (the memory its GPU and Memory report)
// or a [*vramguardtest.PSGPU], so that the fake Ollama and the fake
// ComfyUI share one device.
type Device interface {
	// SetHeld sets what owner holds to bytes, listed with command;
	// growth that does not fit fails with a *vramguardtest.VRAMError and
	// changes nothing; zero releases the owner.
	SetHeld(ctx context.Context, owner, command string, bytes uint64) error
	// HeldPID is the PID owner is listed under.
	HeldPID(owner string) uint32
	// DeviceMemory is the device's total and free bytes.
	DeviceMemory(ctx context.Context) (total, free uint64, err error)
}

var (
	_ Device = (*vramguardtest.Server)(nil)
	_ Device = (*vramguardtest.PSGPU)(nil)
)

// deviceName is the device's name as /system_stats gives it.
func deviceName(dev Device) string {
	if g, ok := dev.(*vramguardtest.PSGPU); ok && g.Name != "" {
		return g.Name
	}
	return "Simulated GPU"
}

// Config configures a fake ComfyUI ([NewServer]). The zero value is
// a ComfyUI in DynamicVRAM mode with no checkpoints (every prompt that
// loads one fails validation), 10 ms sampler steps, no work memory, no
// custom nodes, a free that leaves the GPU at once, a 256 MiB CUDA
// context, and neither --reserve-vram nor --vram-headroom.
type Config struct {
	// Mode is the memory management it follows: DynamicVRAM (the zero
	// value, today's default) or ModelPatcher (0.3.64, or a ComfyUI
	// started with a flag that turns DynamicVRAM off).
	Mode Mode
	// Models maps a checkpoint's file name, CheckpointLoaderSimple's
	// ckpt_name, to the bytes it holds on the GPU once loaded.
	Models map[string]uint64
	// StepTime is the time one sampler step takes (KSampler's "steps"
	// input); zero means DefaultStepTime.
	StepTime time.Duration
	// WorkBytes is held from the start of a prompt's sampling to its end
	// (activations). Then it stays in torch's reserved cache
	// (Memory.Cache) until the worker's next gc, which prompt_worker
	// runs after a prompt only when 10 s have passed since the last one:
	// after the first prompt (last_gc_collect starts at 0) and after a
	// /free at once, so the cache outlives only back-to-back prompts; the
	// worker empties it 10 s after the last gc at the latest.
	WorkBytes uint64
	// CustomNodes are node classes a graph may use besides the built-in
	// ones, by class_type.
	CustomNodes map[string]CustomNode
	// SettleLag is how long the worker takes to apply a /free: the memory
	// leaves the GPU that long after it starts (zero: at once): in
	// ModelPatcher mode all of it at the end, in DynamicVRAM mode a
	// quarter every SettleLag/4 (pages unmapped one model range after
	// another; readings lag, FIELD_NOTES §8 and §9). The worker runs no
	// prompt meanwhile.
	SettleLag time.Duration
	// StatsDelay delays every /system_stats answer that arrives while a
	// free is being applied (from FreeApplied to FreeSettled).
	StatsDelay time.Duration
	// ContextBytes is the process's CUDA context, held from NewServer
	// until Close and never freed; zero means DefaultContextBytes.
	ContextBytes uint64
	// Command is the process's command as the fake GPU lists it; empty
	// means DefaultCommand.
	Command string
	// Argv is /system_stats' system.argv; nil means ["main.py"], followed
	// by --reserve-vram and --vram-headroom (in GB, as ComfyUI's flags
	// take them) when ReserveVRAM and VRAMHeadroom are set.
	Argv []string
	// Version is /system_stats' system.comfyui_version; empty means
	// DefaultVersion in DynamicVRAM mode, ModelPatcherVersion in
	// ModelPatcher mode. It changes nothing else.
	Version string
	// ReserveVRAM is --reserve-vram: in DynamicVRAM mode ComfyUI's own
	// use never grows past the device's total less this (a hard cap, the
	// one partition between ComfyUI and another program); zero means no
	// cap (ComfyUI's own default, 400 MiB, is not modelled). ModelPatcher
	// mode ignores it.
	ReserveVRAM uint64
	// VRAMHeadroom is --vram-headroom: in DynamicVRAM mode, when ComfyUI
	// allocates, it keeps this much plus 256 MiB free on the device,
	// counting other programs' use, by giving back weight pages of its
	// own; it gives nothing back while idle. ModelPatcher mode ignores
	// it.
	VRAMHeadroom uint64
}

// CustomNode is a custom node class ([Config.CustomNodes]). It
// accepts any inputs, links of any type included, and its outputs are of
// any type ("*"). It produces no UI output.
type CustomNode struct {
	// PinBytes is the memory the class allocates the first time a node of
	// it runs and keeps outside ComfyUI's model management (a module-level
	// tensor, say): it survives /free, unload_models and free_memory alike,
	// until Close.
	PinBytes uint64
	// Output makes it an output node (OUTPUT_NODE): a graph with no other
	// output may use it, and it always runs.
	Output bool
}

// Memory is what a fake ComfyUI's process holds on the GPU.
type Memory struct {
	Context uint64 // the CUDA context
	// Models is the checkpoints' weights on the GPU: in torch's pool in
	// ModelPatcher mode; in DynamicVRAM mode mapped outside it (aimdo's
	// VBARs), not counted by /system_stats' torch figures, and possibly
	// only part of a checkpoint (the rest streamed from host RAM).
	Models uint64
	Cache  uint64 // torch's reserved but unallocated cache: held, and counted free by /system_stats
	Work   uint64 // activations of the prompt running
	Pinned uint64 // custom nodes' memory outside model management
}

// Total is everything the process holds.
func (m Memory) Total() uint64 { return m.Context + m.Models + m.Cache + m.Work + m.Pinned }

// EventKind says what a [Event] records.
type EventKind string

// The kinds of [Event].
const (
	// PromptQueued: POST /prompt accepted a prompt. Detail is its
	// number, as the reply gives it.
	PromptQueued EventKind = "prompt_queued"
	// PromptStart: the worker took the prompt (execution_start).
	PromptStart EventKind = "prompt_start"
	// PromptEnd: the prompt ended and is in the history. Detail is
	// "success", "cached" (a success in which no node ran), "error" or
	// "interrupted".
	PromptEnd EventKind = "prompt_end"
	// FreeRequested: POST /free arrived. Detail lists the flags it
	// set ("unload_models", "free_memory", space separated); empty when it
	// set none (and so did not wake the worker).
	FreeRequested EventKind = "free_requested"
	// FreeApplied: the worker began applying the pending flags, after
	// the prompt it was running or at once when idle. Detail lists the
	// flags applied ("unload_models" or "unload_models free_memory").
	FreeApplied EventKind = "free_applied"
	// FreeSettled: the freed memory left the GPU, SettleLag after
	// FreeApplied. Detail is "released <N> bytes".
	FreeSettled EventKind = "free_settled"
	// CacheEmptied: outside a free, the worker handed torch's cache
	// back to the driver (gc.collect and soft_empty_cache after a prompt,
	// at most every 10 s). Detail is "released <N> bytes".
	CacheEmptied EventKind = "cache_emptied"
	// WeightsEvicted: in DynamicVRAM mode, the prompt running needed room
	// and ComfyUI unmapped weight pages of its own (an idle model's
	// first, then the prompt's own, which then stream from host RAM).
	// Detail is "<checkpoint>: <N> bytes".
	WeightsEvicted EventKind = "weights_evicted"
	// PromptCancelled: POST /api/jobs/{id}/cancel removed a queued
	// prompt (one running is interrupted instead, and ends
	// "interrupted"). PromptID is the prompt's.
	PromptCancelled EventKind = "prompt_cancelled"
)

// Event is one thing that happened in a fake ComfyUI.
type Event struct {
	Time     time.Time
	Kind     EventKind
	PromptID string // the prompt's, where there is one
	Detail   string
}

// Server is a fake ComfyUI server: the diffusion server that shares the
// GPU with Ollama, served over real HTTP and WebSocket on 127.0.0.1, whose
// memory is held on a fake GPU ([Device]: a [*vramguardtest.Server]'s
// ledger or a [*vramguardtest.PSGPU]), so that code that makes room on a
// GPU for ComfyUI, or for Ollama next to it, is tested without either.
//
// It has never been run against a real ComfyUI, which needs PyTorch and a
// GPU (no ComfyUI can run on this project's machines). Its two modes
// ([Config.Mode]) follow two readings of ComfyUI's source; where the fake
// and ComfyUI differ, ComfyUI is right:
//
//   - DynamicVRAM, the default: ComfyUI as it runs today on NVIDIA (0.18,
//     March 2026, and later), read in comfy-aimdo's README.md, src/plat.h,
//     comfy_aimdo/torch.py and comfy_aimdo/vram_buffer.py and in
//     ComfyUI's 2026 main.py, server.py, comfy/cli_args.py and
//     comfy/model_management.py (FIELD_NOTES §9).
//   - ModelPatcher: ComfyUI at commit a125cd84 (0.3.64, October 2025:
//     server.py, main.py's prompt_worker, execution.py,
//     comfy_execution/progress.py, comfy/model_management.py;
//     FIELD_NOTES §8), which today's ComfyUI falls back to with
//     --disable-dynamic-vram, --highvram, --gpu-only, --novram or --cpu.
//
// # What it reproduces, in both modes (§8)
//
//   - The routes a client uses, each also under /api: POST /prompt, GET
//     /prompt, GET and POST /queue, GET /history (max_items, offset), GET
//     /history/{prompt_id}, POST /history, POST /interrupt, POST /free,
//     GET /system_stats and GET /ws?clientId=. Unknown paths answer
//     aiohttp's 404, a body that is not JSON aiohttp's 500.
//   - validate_prompt's refusals with its texts: no_prompt,
//     invalid_prompt (a node without class_type, an unknown class),
//     prompt_no_outputs and prompt_outputs_failed_validation with per-node
//     errors (required_input_missing, bad_linked_input,
//     return_type_mismatch, invalid_input_type, value_smaller_than_min,
//     value_bigger_than_max, value_not_in_list for a ckpt_name not in
//     Models, exception_during_validation and
//     exception_during_inner_validation for a link to a missing node).
//     A graph with some valid outputs is queued with the errors of the
//     others in node_errors.
//   - The built-in classes CheckpointLoaderSimple, CLIPTextEncode,
//     EmptyLatentImage, KSampler, VAEDecode, SaveImage and PreviewImage
//     with their inputs, types and bounds, plus Config.CustomNodes.
//   - One worker that runs prompts one at a time in the queue's heap
//     order (number, then prompt_id; front and number as POST /prompt
//     computes them), ComfyUI's node cache (a node whose inputs did not
//     change since a prompt that ran it does not run again: an identical
//     prompt runs nothing and lists every node in execution_cached), its
//     node order, its interrupt points (before each node and after each
//     sampler step) and its messages, to the prompt's client_id only
//     (progress_state and status to every socket, as ComfyUI sends them).
//   - CheckpointLoaderSimple loads its checkpoint (Models[ckpt_name]) and
//     a node that uses a checkpoint unloaded by /free loads it again;
//     KSampler holds WorkBytes (activations, in torch's pool) while the
//     prompt runs; torch's cache (Memory.Cache) is reused by new
//     allocations before they grow, and goes back to the driver after a
//     prompt at most every 10 s (the first prompt's at once).
//   - POST /free: it only sets flags and answers 200 at once; the worker
//     applies them after the prompt it is running (at once when idle):
//     unload_models (implied by free_memory) releases Models and Cache
//     (on every device, today), free_memory also drops the node cache.
//     Pinned and Context stay. Nothing tells the client when it is done;
//     here it takes SettleLag, and /system_stats answers StatsDelay late
//     meanwhile.
//   - /system_stats' vram_free is the device's free memory plus the
//     process's own torch cache, so it overstates what another process
//     can allocate.
//
// # DynamicVRAM (§9)
//
//   - The weights are mapped outside torch's allocator: /system_stats'
//     torch_vram_total and torch_vram_free count only activations, the
//     cache and custom nodes' memory (about 0 for an idle ComfyUI holding
//     a checkpoint), while the fake GPU lists the process with all of it.
//   - An idle ComfyUI keeps its weights resident indefinitely, a
//     checkpoint no prompt uses any more included, and gives nothing back
//     to another program until /free. Its own prompt's allocations take
//     room back: idle checkpoints' pages first ([WeightsEvicted]), then
//     the prompt's own, which then stream from host RAM: no failure, but
//     slower sampler steps. It keeps 256 MiB plus VRAMHeadroom free
//     device-wide when it allocates, and ReserveVRAM caps its own total.
//   - Activations need real VRAM: when even giving back every weight page
//     leaves too little, the prompt fails with exception_type
//     RuntimeError and "VRAM grow failed: <N> bytes" (aimdo's text, as in
//     the log that started this project), and the models stay loaded.
//   - A /free's memory leaves a quarter at a time over SettleLag, so that
//     readings move before they settle (aimdo's notes on cuMemGetInfo
//     lagging large frees).
//   - POST /prompt refuses a client prompt_id that is not a canonical
//     lowercase UUID (400, error type invalid_prompt_id) and one already
//     queued, running or in the history (409, "prompt_id already
//     exists"); POST /api/jobs/{id}/cancel answers {"cancelled": bool}:
//     a queued prompt leaves the queue ([PromptCancelled]), the running
//     one is interrupted. The 400's and 409's error types and details are
//     this fake's guesses; the notes give only the status and the message.
//   - system.comfyui_version is DefaultVersion, and system.argv carries
//     --reserve-vram and --vram-headroom when they are set.
//
// # ModelPatcher (§8)
//
// Models live in torch's pool and count in torch_vram_total. At a prompt's
// start, models whose loader left the node cache move into torch's cache,
// which goes back to the driver at the next gc. A checkpoint is on the GPU
// whole or not at all; an allocation that does not fit is torch's "CUDA
// out of memory" (torch.OutOfMemoryError), after which ComfyUI unloads
// every model. A client prompt_id is taken as given; there is no
// /api/jobs. ReserveVRAM and VRAMHeadroom are ignored.
//
// # What it does not
//
// No image is produced (SaveImage and PreviewImage report file names that
// do not exist, and there is no /view), no model is read, and a
// checkpoint's parts (model, CLIP, VAE) are one allocation. There is one
// device, the torch device cuda:0. sampler_name and scheduler accept any
// string. Other command-line flags (--disable-smart-memory, --cache-lru,
// --lowvram), the LRU and none caches, DynamicVRAM's 2 s cached
// cuMemGetInfo reading and its pinned host RAM are not modelled; nor are
// GET /api/jobs, POST /api/jobs/cancel, system.comfy_package_versions and
// deploy_environment, previews, subgraph expansion, lazy inputs, async
// nodes, object_info, uploads or the frontend. How much slower a step
// with paged weights runs is made up (up to 4 times). Validated values are
// not converted in the stored prompt (ComfyUI stores "20" as 20).
// Tracebacks are placeholders. The fixed system figures (RAM, Python and
// PyTorch versions) are made up. A socket replaced by a new one with the
// same clientId stays open but gets nothing; unlike 0.3.64, whose closing
// socket removes the registration by id, the old socket's close never
// removes the new one's.
//
// A Server is safe for concurrent use. Close it when done: Close stops
// its worker, timers and sockets, frees its memory on the device and
// returns once every goroutine it started has returned.
type Server struct {
	cfg     Config
	dev     Device
	owner   string // unique name of the process on the device
	pid     uint32
	ckpts   []string // Models' names, sorted (folder_paths.get_filename_list)
	hs      *httptest.Server
	url     *url.URL
	ctx     context.Context // canceled by Close: device calls, sockets
	cancel  context.CancelFunc
	done    chan struct{} // closed by Close
	wake    chan struct{} // wakes the worker: a prompt or a flag
	wg      sync.WaitGroup
	closing sync.Once

	mu       sync.Mutex
	closed   bool
	number   int64        // PromptServer.number
	queue    []*comfyItem // a heap, in heapq's layout
	running  *comfyItem
	history  []*comfyHistory // insertion order
	flags    comfyFlags
	stop     bool // nodes.interrupt_processing
	applying bool // a free is being applied
	held     Memory
	resident map[string]uint64           // checkpoints on the GPU: their bytes there
	active   map[string]bool             // the checkpoints the running prompt loads
	cache    map[string]*comfyCacheEntry // node cache by input signature
	objects  map[string]string           // PreviewImage objects' file prefixes, by node id and class
	pinned   map[string]bool             // custom classes that pinned their memory
	counters map[string]int              // SaveImage's last file counter by folder and prefix
	execTo   *string                     // the running prompt's client_id (server.client_id)
	lastNode string                      // server.last_node_id
	sockets  map[string]*comfySocket
	events   []Event
	changed  chan struct{} // closed and replaced at every event and change of Held
}

// comfyFlags are the pending /free flags (PromptQueue.flags).
type comfyFlags struct{ unload, free bool }

func (f comfyFlags) set() bool { return f.unload || f.free }

func (f comfyFlags) String() string {
	var s []string
	if f.unload {
		s = append(s, "unload_models")
	}
	if f.free {
		s = append(s, "free_memory")
	}
	return strings.Join(s, " ")
}

// comfyCacheEntry is a node's cached output: what a later identical node
// reuses instead of running.
type comfyCacheEntry struct {
	ckpt string  // the checkpoint a CheckpointLoaderSimple loaded
	ui   jsonObj // an output node's UI output; nil for none
	node string  // the node that produced it, for the meta of the history
}

// NewServer starts a fake ComfyUI on 127.0.0.1 whose process holds its
// memory on dev, and holds its CUDA context there at once. It fails when
// dev is nil, cfg is invalid (a negative duration, a custom class named
// like a built-in one or empty, an empty checkpoint name) or the context
// does not fit on dev (a [*vramguardtest.VRAMError] in the chain). Like
// httptest.NewServer it panics if it cannot listen.
func NewServer(dev Device, cfg Config) (*Server, error) {
	switch d := dev.(type) {
	case nil:
		return nil, errors.New("fake comfyui: no device")
	case *vramguardtest.Server:
		if d == nil {
			return nil, errors.New("fake comfyui: no device")
		}
	case *vramguardtest.PSGPU:
		if d == nil || d.Client == nil {
			return nil, errors.New("fake comfyui: a PSGPU device needs a Client")
		}
	}
	if cfg.StepTime < 0 || cfg.SettleLag < 0 || cfg.StatsDelay < 0 {
		return nil, errors.New("fake comfyui: negative duration in config")
	}
	if cfg.Mode > ModelPatcher {
		return nil, fmt.Errorf("fake comfyui: unknown mode %v", cfg.Mode)
	}
	for name := range cfg.CustomNodes {
		if name == "" || comfyBuiltins[name] != nil {
			return nil, fmt.Errorf("fake comfyui: custom node class %q is empty or built in", name)
		}
	}
	ckpts := make([]string, 0, len(cfg.Models))
	for name := range cfg.Models {
		if name == "" {
			return nil, errors.New("fake comfyui: empty checkpoint name")
		}
		ckpts = append(ckpts, name)
	}
	slices.Sort(ckpts)
	if cfg.StepTime == 0 {
		cfg.StepTime = DefaultStepTime
	}
	if cfg.ContextBytes == 0 {
		cfg.ContextBytes = DefaultContextBytes
	}
	cfg.Command = cmp.Or(cfg.Command, DefaultCommand)
	if cfg.Argv == nil {
		cfg.Argv = []string{"main.py"}
		if cfg.ReserveVRAM > 0 {
			cfg.Argv = append(cfg.Argv, "--reserve-vram", gbFlag(cfg.ReserveVRAM))
		}
		if cfg.VRAMHeadroom > 0 {
			cfg.Argv = append(cfg.Argv, "--vram-headroom", gbFlag(cfg.VRAMHeadroom))
		}
	}
	if cfg.Mode == ModelPatcher {
		cfg.Version = cmp.Or(cfg.Version, ModelPatcherVersion)
	}
	cfg.Version = cmp.Or(cfg.Version, DefaultVersion)

	var id [8]byte
	_, _ = rand.Read(id[:])
	c := &Server{
		cfg:      cfg,
		dev:      dev,
		owner:    "fake comfyui " + hex.EncodeToString(id[:]),
		ckpts:    ckpts,
		done:     make(chan struct{}),
		wake:     make(chan struct{}, 1),
		resident: make(map[string]uint64),
		active:   make(map[string]bool),
		cache:    make(map[string]*comfyCacheEntry),
		objects:  make(map[string]string),
		pinned:   make(map[string]bool),
		counters: make(map[string]int),
		sockets:  make(map[string]*comfySocket),
		changed:  make(chan struct{}),
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if err := dev.SetHeld(c.ctx, c.owner, cfg.Command, cfg.ContextBytes); err != nil {
		c.cancel()
		return nil, fmt.Errorf("fake comfyui: the cuda context does not fit on the device: %w", err)
	}
	c.held.Context = cfg.ContextBytes
	c.pid = dev.HeldPID(c.owner)
	c.hs = httptest.NewServer(http.HandlerFunc(c.serveHTTP))
	u, err := url.Parse(c.hs.URL)
	if err != nil {
		c.hs.Close()
		_ = dev.SetHeld(context.Background(), c.owner, "", 0)
		c.cancel()
		panic("fake comfyui: " + err.Error())
	}
	c.url = u
	c.wg.Add(1)
	go c.work()
	return c, nil
}

// URL returns the server's base URL (http://127.0.0.1:port).
func (c *Server) URL() *url.URL {
	u := *c.url
	return &u
}

// PID returns the fake process id the fake GPU lists the process under
// (role other, command Config.Command). It is stable for the
// ComfyUI's life.
func (c *Server) PID() uint32 { return c.pid }

// Client returns an HTTP client for the server, as httptest.Server's
// Client does: its idle connections are closed by Close, so that a test's
// goroutine check sees none.
func (c *Server) Client() *http.Client { return c.hs.Client() }

// WaitFor blocks until cond returns true, or ctx is done (it then returns
// context.Cause(ctx)), or the ComfyUI is closed. cond is called at once
// and after every event and every change of what the process holds; it
// may call Held and Events.
func (c *Server) WaitFor(ctx context.Context, cond func() bool) error {
	return waitChange(ctx, &c.mu, &c.changed, c.done, "fake comfyui: closed", cond)
}

// notifyLocked wakes WaitFor callers.
func (c *Server) notifyLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// Held returns what the process holds on the GPU now. Memory a /free
// releases is held until it settles. It is safe for concurrent use.
func (c *Server) Held() Memory {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.held
}

// Events returns what happened, oldest first (the last 4096 events). It is
// safe for concurrent use.
func (c *Server) Events() []Event {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}

// Close stops the server: the worker (a prompt running is cut short and
// never reaches the history), its timers and every WebSocket; it frees
// everything the process holds on the device and returns once every
// goroutine the ComfyUI started has returned. It is safe to call more
// than once.
func (c *Server) Close() {
	c.closing.Do(func() {
		c.mu.Lock()
		c.closed = true
		close(c.done)
		c.cancel()
		c.mu.Unlock()
		c.hs.Close()
		c.wg.Wait()
		_ = c.dev.SetHeld(context.Background(), c.owner, "", 0)
		c.mu.Lock()
		c.held = Memory{}
		c.mu.Unlock()
	})
}

func (c *Server) eventLocked(kind EventKind, promptID, detail string) {
	if len(c.events) == comfyMaxEvents {
		c.events = slices.Delete(c.events, 0, 1)
	}
	c.events = append(c.events, Event{Time: time.Now(), Kind: kind, PromptID: promptID, Detail: detail})
	c.notifyLocked()
}

// signal wakes the worker (PromptQueue.not_empty.notify).
func (c *Server) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// sleep waits d, and reports false when the ComfyUI closed first.
func (c *Server) sleep(d time.Duration) bool {
	if d <= 0 {
		return !c.isClosed()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-c.done:
		return false
	}
}

func (c *Server) isClosed() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// The worker: main.py's prompt_worker.

func (c *Server) work() {
	defer c.wg.Done()
	var (
		needGC bool
		lastGC time.Time // zero: last_gc_collect = 0, long ago
	)
	for {
		it, alive := c.next(needGC, lastGC)
		if !alive {
			return
		}
		if it != nil {
			r, alive := c.execute(it)
			if !alive {
				return
			}
			needGC = true
			c.taskDone(it, r)
		}
		c.mu.Lock()
		flags := c.flags
		c.flags = comfyFlags{}
		c.mu.Unlock()
		if flags.set() {
			if !c.applyFree(flags) {
				return
			}
			needGC, lastGC = true, time.Time{}
		}
		if needGC && time.Since(lastGC) > comfyGCInterval {
			c.emptyCache()
			needGC, lastGC = false, time.Now()
		}
	}
}

// next waits for a prompt (returned, now running), for flags or for the
// gc deadline (nil); alive is false once the ComfyUI is closed.
func (c *Server) next(needGC bool, lastGC time.Time) (it *comfyItem, alive bool) {
	for {
		c.mu.Lock()
		switch {
		case c.closed:
			c.mu.Unlock()
			return nil, false
		case len(c.queue) > 0:
			it = c.popLocked()
			c.running = it
			c.queueUpdatedLocked()
			c.mu.Unlock()
			return it, true
		case c.flags.set():
			c.mu.Unlock()
			return nil, true
		}
		c.mu.Unlock()
		var t *time.Timer
		var deadline <-chan time.Time
		if needGC {
			d := comfyGCInterval - time.Since(lastGC)
			if d <= 0 {
				return nil, true
			}
			t = time.NewTimer(d)
			deadline = t.C
		}
		var timedOut, closed bool
		select {
		case <-c.wake:
		case <-deadline:
			timedOut = true
		case <-c.done:
			closed = true
		}
		if t != nil {
			t.Stop()
		}
		if timedOut || closed {
			return nil, !closed
		}
	}
}

// applyFree applies /free's flags, as prompt_worker does after a prompt:
// unload_all_models (and torch's cache with it), for free_memory the node
// cache too. The memory leaves the device over SettleLag: at its end in
// ModelPatcher mode, a quarter at a time in DynamicVRAM mode.
func (c *Server) applyFree(f comfyFlags) (alive bool) {
	f.unload = true // implied by free_memory
	c.mu.Lock()
	c.applying = true
	c.eventLocked(FreeApplied, "", f.String())
	h := c.held
	released := h.Models + h.Cache
	c.mu.Unlock()
	parts := uint64(1)
	if c.cfg.Mode == DynamicVRAM && c.cfg.SettleLag > 0 {
		parts = 4
	}
	for i := uint64(1); i <= parts; i++ {
		if !c.sleep(c.cfg.SettleLag / time.Duration(parts)) {
			return false // closed: Close frees everything
		}
		c.mu.Lock()
		h := c.held
		left := released - released*i/parts // what this free has still to release
		h.Models = min(h.Models, left)
		h.Cache = min(h.Cache, left-h.Models)
		if i == parts {
			clear(c.resident)
			if f.free {
				clear(c.cache)
				clear(c.objects)
			}
		}
		c.mu.Unlock()
		_ = c.commit(h) // shrinking cannot fail
	}
	c.mu.Lock()
	c.applying = false
	c.eventLocked(FreeSettled, "", fmt.Sprintf("released %d bytes", released))
	c.mu.Unlock()
	return true
}

// emptyCache is gc.collect and soft_empty_cache after prompts.
func (c *Server) emptyCache() {
	c.mu.Lock()
	h := c.held
	n := h.Cache
	h.Cache = 0
	c.mu.Unlock()
	if n == 0 {
		return
	}
	_ = c.commit(h)
	c.mu.Lock()
	c.eventLocked(CacheEmptied, "", fmt.Sprintf("released %d bytes", n))
	c.mu.Unlock()
}

// Memory. Only the worker changes what the process holds (and Close, once
// the worker has returned), so it reads c.held, asks the device and then
// stores the result without holding c.mu across the device call.

// commit makes h what the process holds, on the device and in Held.
// Growth that does not fit fails and changes nothing.
func (c *Server) commit(h Memory) error {
	c.mu.Lock()
	old := c.held
	c.mu.Unlock()
	if h.Total() != old.Total() {
		if err := c.dev.SetHeld(c.ctx, c.owner, c.cfg.Command, h.Total()); err != nil {
			return err
		}
	}
	c.mu.Lock()
	c.held = h
	c.notifyLocked()
	c.mu.Unlock()
	return nil
}

// take allocates n bytes into the field of Memory that field picks,
// reusing torch's cache first, as the caching allocator does.
func (c *Server) take(n uint64, field func(*Memory) *uint64) error {
	c.mu.Lock()
	h := c.held
	c.mu.Unlock()
	reuse := min(n, h.Cache)
	h.Cache -= reuse
	*field(&h) += n
	return c.commit(h)
}

// loadModel puts a checkpoint on the GPU unless it is there. In
// DynamicVRAM mode it maps what fits, idle checkpoints' pages given back
// first to make room, and streams the rest (it never fails for weights,
// FIELD_NOTES §9); in ModelPatcher mode the whole checkpoint or an error.
func (c *Server) loadModel(name string) error {
	size := c.cfg.Models[name]
	c.mu.Lock()
	there, ok := c.resident[name]
	c.mu.Unlock()
	if c.cfg.Mode == ModelPatcher {
		if ok {
			return nil
		}
		if err := c.take(size, func(m *Memory) *uint64 { return &m.Models }); err != nil {
			return err
		}
		c.mu.Lock()
		c.resident[name] = size
		c.mu.Unlock()
		return nil
	}
	if ok && there >= size {
		return nil
	}
	want := size - there
	room, err := c.makeRoom(want, false)
	if err != nil {
		return err
	}
	got := min(want, room)
	if got == 0 {
		c.mu.Lock()
		c.resident[name] = there
		c.mu.Unlock()
		return nil
	}
	c.mu.Lock()
	h := c.held
	c.mu.Unlock()
	h.Models += got
	if err := c.commit(h); err != nil {
		var ve *vramguardtest.VRAMError
		if errors.As(err, &ve) { // another program took the room meanwhile: stream it all
			c.mu.Lock()
			c.resident[name] = there
			c.mu.Unlock()
			return nil
		}
		return err
	}
	c.mu.Lock()
	c.resident[name] = there + got
	c.mu.Unlock()
	return nil
}

// room is how much the process may grow now in DynamicVRAM mode: the
// device's free memory less the headroom it keeps, within --reserve-vram's
// cap.
func (c *Server) room() (uint64, error) {
	total, free, err := c.dev.DeviceMemory(c.ctx)
	if err != nil {
		return 0, err
	}
	room := sub(free, DynamicVRAMHeadroom+c.cfg.VRAMHeadroom)
	if c.cfg.ReserveVRAM > 0 {
		room = min(room, sub(sub(total, c.cfg.ReserveVRAM), c.Held().Total()))
	}
	return room, nil
}

// makeRoom gives back weight pages of its own until the process may grow
// by want (DynamicVRAM: "inactive models are preserved in VRAM right up
// until there is higher priority demand"): idle checkpoints' first, then,
// with own, those of the prompt running (they then stream). It returns the
// room it found, which can be less than want.
func (c *Server) makeRoom(want uint64, own bool) (uint64, error) {
	for first := true; ; first = false {
		room, err := c.room()
		if err != nil || room >= want {
			return room, err
		}
		c.mu.Lock()
		if first && own {
			// Activations that would not fit even with every page given
			// back fail at once, and the weights stay.
			var pages uint64
			for _, n := range c.resident {
				pages += n
			}
			if room+pages < want {
				c.mu.Unlock()
				return room, nil
			}
		}
		victim := ""
		for _, name := range c.ckpts { // sorted: a stable choice
			if c.resident[name] > 0 && !c.active[name] {
				victim = name
				break
			}
		}
		if victim == "" && own {
			for _, name := range c.ckpts {
				if c.resident[name] > 0 {
					victim = name
					break
				}
			}
		}
		if victim == "" {
			c.mu.Unlock()
			return room, nil
		}
		n := min(c.resident[victim], want-room)
		c.resident[victim] -= n
		h := c.held
		h.Models -= n
		c.eventLocked(WeightsEvicted, "", fmt.Sprintf("%s: %d bytes", victim, n))
		c.mu.Unlock()
		_ = c.commit(h) // shrinking cannot fail
	}
}

// stepTime is a sampler step's time with the fraction of the model's
// weights that is not resident streamed from host RAM.
func (c *Server) stepTime(ckpt string) time.Duration {
	size := c.cfg.Models[ckpt]
	if c.cfg.Mode == ModelPatcher || size == 0 {
		return c.cfg.StepTime
	}
	c.mu.Lock()
	paged := size - min(size, c.resident[ckpt])
	c.mu.Unlock()
	return c.cfg.StepTime + time.Duration(float64(c.cfg.StepTime)*pagedSlowdown*float64(paged)/float64(size))
}

func sub(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return 0
}

// unloadAllAfterOOM is execute()'s unload_all_models after an out of
// memory error (ModelPatcher mode): every model leaves, and torch's cache
// with them.
func (c *Server) unloadAllAfterOOM() {
	c.mu.Lock()
	h := c.held
	h.Models, h.Cache = 0, 0
	clear(c.resident)
	c.mu.Unlock()
	_ = c.commit(h)
}

// dropUnusedLocked is the node cache's clean_unused at a prompt's start:
// entries the prompt has no node for go, and (ModelPatcher mode) a
// checkpoint no remaining entry loaded leaves the GPU for torch's cache;
// in DynamicVRAM mode its weights stay where they are. It also notes the
// checkpoints the prompt loads (the active ones).
func (c *Server) dropUnusedLocked(g *comfyGraph) {
	keep := make(map[string]bool, len(g.order))
	objects := make(map[string]bool, len(g.order))
	for _, id := range g.order {
		keep[g.sigs[id]] = true
		objects[id+"\x00"+g.nodes[id].class] = true
	}
	for sig := range c.cache {
		if !keep[sig] {
			delete(c.cache, sig)
		}
	}
	for k := range c.objects {
		if !objects[k] {
			delete(c.objects, k)
		}
	}
	clear(c.active)
	for _, id := range g.order {
		if n := g.nodes[id]; n.class == "CheckpointLoaderSimple" {
			c.active[pyStr(n.input("ckpt_name"))] = true
		}
	}
	if c.cfg.Mode == DynamicVRAM {
		return // an idle model's weights stay resident until room is needed or /free
	}
	used := make(map[string]bool)
	for _, e := range c.cache {
		if e.ckpt != "" {
			used[e.ckpt] = true
		}
	}
	for name := range c.resident {
		if !used[name] {
			delete(c.resident, name)
			b := c.cfg.Models[name]
			c.held.Models -= b
			c.held.Cache += b
		}
	}
}

// oomMessage is torch's CUDA out of memory text for an allocation of n
// bytes the device could not grant.
func (c *Server) oomMessage(n uint64, ve *vramguardtest.VRAMError) string {
	total, free, err := c.dev.DeviceMemory(c.ctx)
	if err != nil {
		free = ve.Free
	}
	h := c.Held()
	return fmt.Sprintf("CUDA out of memory. Tried to allocate %s. GPU 0 has a total capacity of %s of which %s is free. "+
		"Including non-PyTorch memory, this process has %s memory in use. Of the allocated memory %s is allocated by PyTorch, "+
		"and %s is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "+
		"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  "+
		"(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
		torchSize(n), torchSize(total), torchSize(free), torchSize(h.Total()),
		torchSize(h.Models+h.Work+h.Pinned), torchSize(h.Cache))
}

// torchSize is c10's format_size.
func torchSize(n uint64) string {
	switch {
	case n <= 1024:
		return fmt.Sprintf("%d bytes", n)
	case n <= 1<<20:
		return fmt.Sprintf("%.2f KiB", float64(n)/(1<<10))
	case n <= 1<<30:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
}

// The queue: PromptQueue, a heapq of (number, prompt_id, prompt,
// extra_data, outputs_to_execute).

// comfyItem is one queued prompt.
type comfyItem struct {
	number  pyNum
	id      string
	prompt  jsonObj // the graph as sent
	extra   jsonObj // extra_data, client_id included
	outputs []string
	to      *string // the client_id messages go to; nil for none
	graph   *comfyGraph
}

// tuple is the item as /queue and the history list it.
func (it *comfyItem) tuple() []any {
	outs := make([]any, len(it.outputs))
	for i, o := range it.outputs {
		outs[i] = o
	}
	return []any{it.number, it.id, it.prompt, it.extra, outs}
}

func comfyLess(a, b *comfyItem) bool {
	if a.number.f != b.number.f {
		return a.number.f < b.number.f
	}
	return a.id < b.id
}

// pushLocked is heapq.heappush.
func (c *Server) pushLocked(it *comfyItem) {
	c.queue = append(c.queue, it)
	comfySiftDown(c.queue, 0, len(c.queue)-1)
}

// popLocked is heapq.heappop.
func (c *Server) popLocked() *comfyItem {
	n := len(c.queue) - 1
	last := c.queue[n]
	c.queue[n] = nil
	c.queue = c.queue[:n]
	if n == 0 {
		return last
	}
	top := c.queue[0]
	c.queue[0] = last
	comfySiftUp(c.queue, 0)
	return top
}

// comfyHeapify is heapq.heapify.
func comfyHeapify(q []*comfyItem) {
	for i := len(q)/2 - 1; i >= 0; i-- {
		comfySiftUp(q, i)
	}
}

// comfySiftDown is heapq's _siftdown.
func comfySiftDown(q []*comfyItem, start, pos int) {
	item := q[pos]
	for pos > start {
		parent := (pos - 1) >> 1
		if !comfyLess(item, q[parent]) {
			break
		}
		q[pos] = q[parent]
		pos = parent
	}
	q[pos] = item
}

// comfySiftUp is heapq's _siftup.
func comfySiftUp(q []*comfyItem, pos int) {
	end, start, item := len(q), pos, q[pos]
	child := 2*pos + 1
	for child < end {
		if right := child + 1; right < end && !comfyLess(q[child], q[right]) {
			child = right
		}
		q[pos] = q[child]
		pos = child
		child = 2*pos + 1
	}
	q[pos] = item
	comfySiftDown(q, start, pos)
}

// queueInfoLocked is PromptServer.get_queue_info.
func (c *Server) queueInfoLocked() jsonObj {
	n := len(c.queue)
	if c.running != nil {
		n++
	}
	return jsonObj{{"exec_info", jsonObj{{"queue_remaining", n}}}}
}

// queueUpdatedLocked is PromptServer.queue_updated: a status to every
// socket.
func (c *Server) queueUpdatedLocked() {
	c.sendLocked("status", jsonObj{{"status", c.queueInfoLocked()}}, nil)
}

// comfyHistory is one entry of the history.
type comfyHistory struct {
	item    *comfyItem
	outputs jsonObj
	status  jsonObj
	meta    jsonObj
}

func (h *comfyHistory) json() jsonObj {
	return jsonObj{{"prompt", h.item.tuple()}, {"outputs", h.outputs}, {"status", h.status}, {"meta", h.meta}}
}

// taskDone is PromptQueue.task_done and what prompt_worker sends after it.
func (c *Server) taskDone(it *comfyItem, r *comfyRun) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running = nil
	status := "error"
	if r.success {
		status = "success"
	}
	msgs := make([]any, len(r.messages))
	copy(msgs, r.messages)
	h := &comfyHistory{
		item:    it,
		outputs: r.outputs,
		status:  jsonObj{{"status_str", status}, {"completed", r.success}, {"messages", msgs}},
		meta:    r.meta,
	}
	if i := slices.IndexFunc(c.history, func(e *comfyHistory) bool { return e.item.id == it.id }); i >= 0 {
		c.history[i] = h // a dict keeps the key's place
	} else {
		if len(c.history) > 10000 { // MAXIMUM_HISTORY_SIZE
			c.history = slices.Delete(c.history, 0, 1)
		}
		c.history = append(c.history, h)
	}
	c.eventLocked(PromptEnd, it.id, r.outcome())
	c.queueUpdatedLocked()
	if it.to != nil {
		c.sendLocked("executing", jsonObj{{"node", nil}, {"prompt_id", it.id}}, it.to)
	}
}

// Execution: PromptExecutor.execute_async and execute().

// comfyRun is one prompt's execution.
type comfyRun struct {
	c         *Server
	it        *comfyItem
	messages  []any // status_messages: [event, data] pairs
	executed  []string
	ran       bool
	success   bool
	interrupt bool
	progress  []string // the progress registry's nodes, in order
	pstate    map[string]*comfyProgress
	outputs   jsonObj
	meta      jsonObj
}

// comfyProgress is a node's entry in the progress registry.
type comfyProgress struct {
	state      string
	value, max pyNum
}

func (r *comfyRun) outcome() string {
	switch {
	case r.interrupt:
		return "interrupted"
	case !r.success:
		return "error"
	case !r.ran:
		return "cached"
	}
	return "success"
}

// addMessageLocked is PromptExecutor.add_message.
func (r *comfyRun) addMessageLocked(event string, data jsonObj, broadcast bool) {
	data = append(slices.Clone(data), jsonKV{"timestamp", time.Now().UnixMilli()})
	r.messages = append(r.messages, []any{event, data})
	if r.it.to != nil || broadcast {
		r.c.sendLocked(event, data, r.it.to)
	}
}

// progressLocked updates a node's progress entry and sends progress_state
// to every socket, as WebUIProgressHandler does.
func (r *comfyRun) progressLocked(id, state string, value, max *pyNum) {
	p, ok := r.pstate[id]
	if !ok {
		p = &comfyProgress{state: "pending", value: pyInt(0), max: pyInt(1)}
		r.pstate[id] = p
		r.progress = append(r.progress, id)
	}
	p.state = state
	switch state {
	case "running":
		p.value, p.max = *value, *max
	case "finished":
		p.value = p.max
	}
	nodes := jsonObj{}
	for _, n := range r.progress {
		q := r.pstate[n]
		if q.state == "pending" {
			continue
		}
		nodes = append(nodes, jsonKV{n, jsonObj{
			{"value", q.value}, {"max", q.max}, {"state", q.state}, {"node_id", n}, {"prompt_id", r.it.id},
			{"display_node_id", n}, {"parent_node_id", nil}, {"real_node_id", n},
		}})
	}
	r.c.sendLocked("progress_state", jsonObj{{"prompt_id", r.it.id}, {"nodes", nodes}}, nil)
}

// comfyFailure is why a node failed.
type comfyFailure struct {
	node      string
	interrupt bool
	typ, msg  string
	inputs    jsonObj
}

// execute runs a prompt. alive is false when the ComfyUI closed meanwhile.
func (c *Server) execute(it *comfyItem) (r *comfyRun, alive bool) {
	g := it.graph
	r = &comfyRun{c: c, it: it, success: true, pstate: make(map[string]*comfyProgress)}
	c.mu.Lock()
	c.stop = false
	c.execTo = it.to
	c.eventLocked(PromptStart, it.id, "")
	r.addMessageLocked("execution_start", jsonObj{{"prompt_id", it.id}}, false)
	c.dropUnusedLocked(g)
	c.notifyLocked()
	cachedNodes := []any{}
	for _, id := range g.order {
		if c.cache[g.sigs[id]] != nil {
			cachedNodes = append(cachedNodes, id)
		}
	}
	r.addMessageLocked("execution_cached", jsonObj{{"nodes", cachedNodes}, {"prompt_id", it.id}}, false)
	el := newComfyExecList(g, func(id string) bool { return c.cache[g.sigs[id]] != nil })
	for _, o := range it.outputs {
		el.add(o)
	}
	c.mu.Unlock()

	for !el.empty() {
		id, ok := el.stage()
		if !ok {
			r.fail(&comfyFailure{node: id, typ: "graph.DependencyCycleError", msg: "Dependency cycle detected", inputs: jsonObj{}})
			break
		}
		f, alive := r.node(id)
		if !alive {
			return r, false
		}
		if f != nil {
			r.fail(f)
			break
		}
		el.complete(id)
	}
	c.mu.Lock()
	if r.success {
		r.addMessageLocked("execution_success", jsonObj{{"prompt_id", it.id}}, false)
	}
	r.outputs, r.meta = jsonObj{}, jsonObj{}
	for _, id := range g.order {
		if e := c.cache[g.sigs[id]]; e != nil && e.ui != nil {
			r.outputs = append(r.outputs, jsonKV{id, e.ui})
			r.meta = append(r.meta, jsonKV{id, jsonObj{{"node_id", id}, {"display_node", id}, {"parent_node", nil}, {"real_node_id", id}}})
		}
	}
	c.lastNode = ""
	c.execTo = nil
	c.held.Cache += c.held.Work // the activations' memory stays reserved
	c.held.Work = 0
	c.notifyLocked()
	c.mu.Unlock()
	return r, true
}

// fail is handle_execution_error.
func (r *comfyRun) fail(f *comfyFailure) {
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	r.success = false
	executed := make([]any, len(r.executed))
	for i, e := range r.executed {
		executed[i] = e
	}
	class := r.it.graph.nodes[f.node].class
	if f.interrupt {
		r.interrupt = true
		r.addMessageLocked("execution_interrupted", jsonObj{
			{"prompt_id", r.it.id}, {"node_id", f.node}, {"node_type", class}, {"executed", executed},
		}, true)
		return
	}
	current := make([]any, len(r.it.graph.order)) // caches.outputs.all_node_ids(): the prompt's nodes
	for i, id := range r.it.graph.order {
		current[i] = id
	}
	r.addMessageLocked("execution_error", jsonObj{
		{"prompt_id", r.it.id}, {"node_id", f.node}, {"node_type", class}, {"executed", executed},
		{"exception_message", f.msg}, {"exception_type", f.typ},
		{"traceback", []any{"  File \"execution.py\", in execute\n    (the fake ComfyUI has no Python traceback)\n"}},
		{"current_inputs", f.inputs}, {"current_outputs", current},
	}, false)
}

// interrupted is throw_exception_if_processing_interrupted.
func (c *Server) interrupted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stop {
		c.stop = false
		return true
	}
	return false
}

// node runs one node of the prompt, as execute() does.
func (r *comfyRun) node(id string) (f *comfyFailure, alive bool) {
	c, g := r.c, r.it.graph
	n := g.nodes[id]
	c.mu.Lock()
	if e := c.cache[g.sigs[id]]; e != nil {
		if r.it.to != nil {
			var out any
			if e.ui != nil {
				out = e.ui
			}
			c.sendLocked("executed", jsonObj{{"node", id}, {"display_node", id}, {"output", out}, {"prompt_id", r.it.id}}, r.it.to)
		}
		r.progressLocked(id, "finished", nil, nil)
		c.mu.Unlock()
		return nil, true
	}
	zero, one := pyFloat(0), pyFloat(1)
	r.progressLocked(id, "running", &zero, &one)
	if r.it.to != nil {
		c.lastNode = id
		c.sendLocked("executing", jsonObj{{"node", id}, {"display_node", id}, {"prompt_id", r.it.id}}, r.it.to)
	}
	c.mu.Unlock()
	if c.interrupted() { // before_node_execution
		return &comfyFailure{node: id, interrupt: true}, true
	}
	r.ran = true
	entry := &comfyCacheEntry{node: id}
	fail := func(err error) (*comfyFailure, bool) {
		if c.isClosed() {
			return nil, false
		}
		return r.allocFailure(id, err), true
	}
	switch n.class {
	case "CheckpointLoaderSimple":
		name := pyStr(n.input("ckpt_name"))
		if err := c.loadModel(name); err != nil {
			return fail(err)
		}
		entry.ckpt = name
	case "CLIPTextEncode", "VAEDecode", "KSampler":
		if name, ok := g.ckptOf(n, comfyModelInput[n.class], c.cfg.Models, map[string]bool{}); ok {
			if err := c.loadModel(name); err != nil {
				return fail(err)
			}
		}
		if n.class != "KSampler" {
			break
		}
		c.mu.Lock()
		need := c.cfg.WorkBytes - min(c.cfg.WorkBytes, c.held.Work)
		grow := need - min(need, c.held.Cache) // what torch's cache cannot cover
		c.mu.Unlock()
		if need > 0 && c.cfg.Mode == DynamicVRAM && grow > 0 {
			// Activations need real VRAM: weight pages go first, the
			// prompt's own included; when even that is not enough,
			// aimdo's "VRAM grow failed" (FIELD_NOTES §9).
			room, err := c.makeRoom(grow, true)
			if err != nil {
				return fail(err)
			}
			if room < grow {
				return fail(&vramguardtest.VRAMError{Owner: c.cfg.Command, Requested: grow, Free: room})
			}
		}
		if need > 0 {
			if err := c.take(need, func(m *Memory) *uint64 { return &m.Work }); err != nil {
				return fail(err)
			}
		}
		step := c.cfg.StepTime
		if name, ok := g.ckptOf(n, "model", c.cfg.Models, map[string]bool{}); ok {
			step = c.stepTime(name)
		}
		steps := n.intInput("steps")
		for i := int64(1); i <= steps; i++ {
			if !c.sleep(step) {
				return nil, false
			}
			if c.interrupted() { // the progress hook
				return &comfyFailure{node: id, interrupt: true}, true
			}
			c.mu.Lock()
			v, m := pyInt(i), pyInt(steps)
			r.progressLocked(id, "running", &v, &m)
			c.sendLocked("progress", jsonObj{{"value", i}, {"max", steps}, {"prompt_id", r.it.id}, {"node", id}}, r.it.to)
			c.mu.Unlock()
		}
	case "SaveImage", "PreviewImage":
		entry.ui = r.images(n)
	default:
		if cn, ok := c.cfg.CustomNodes[n.class]; ok {
			c.mu.Lock()
			pinned := c.pinned[n.class]
			c.mu.Unlock()
			if !pinned && cn.PinBytes > 0 {
				if err := c.take(cn.PinBytes, func(m *Memory) *uint64 { return &m.Pinned }); err != nil {
					return fail(err)
				}
			}
			c.mu.Lock()
			c.pinned[n.class] = true
			c.mu.Unlock()
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if entry.ui != nil && r.it.to != nil {
		c.sendLocked("executed", jsonObj{{"node", id}, {"display_node", id}, {"output", entry.ui}, {"prompt_id", r.it.id}}, r.it.to)
	}
	c.cache[g.sigs[id]] = entry
	r.progressLocked(id, "finished", nil, nil)
	r.executed = append(r.executed, id)
	return nil, true
}

// allocFailure turns a device refusal into the node's error: torch's out
// of memory error, after which ComfyUI unloads every model.
func (r *comfyRun) allocFailure(id string, err error) *comfyFailure {
	n := r.it.graph.nodes[id]
	inputs := jsonObj{}
	for _, kv := range n.inputs {
		if _, link := comfyLink(kv.V); !link {
			inputs = append(inputs, jsonKV{kv.K, []any{pyStr(kv.V)}})
		}
	}
	var ve *vramguardtest.VRAMError
	if !errors.As(err, &ve) {
		return &comfyFailure{node: id, typ: "RuntimeError", msg: "CUDA error: " + err.Error() + "\n", inputs: inputs}
	}
	if r.c.cfg.Mode == DynamicVRAM {
		// aimdo's error, a RuntimeError, not torch's out of memory one;
		// ComfyUI's retry path (which unloads every model after "out of
		// memory") does not match it, so the models stay.
		return &comfyFailure{node: id, typ: "RuntimeError", inputs: inputs, msg: fmt.Sprintf("VRAM grow failed: %d bytes", ve.Requested)}
	}
	msg := r.c.oomMessage(ve.Requested, ve)
	r.c.unloadAllAfterOOM()
	return &comfyFailure{
		node: id, typ: "torch.OutOfMemoryError", inputs: inputs,
		msg: msg + "\nThis error means you ran out of memory on your GPU.\n\nTIPS: If the workflow worked before you might have accidentally set the batch_size to a large number.",
	}
}

// images is SaveImage's or PreviewImage's UI output: one file per image
// of the batch, numbered as get_save_image_path numbers them.
func (r *comfyRun) images(n *comfyNode) jsonObj {
	c := r.c
	c.mu.Lock()
	defer c.mu.Unlock()
	typ, prefix := "output", "ComfyUI"
	if n.class == "SaveImage" {
		if v, ok := n.inputs.get("filename_prefix"); ok {
			prefix = pyStr(v)
		}
	} else {
		typ = "temp"
		key := n.id + "\x00" + n.class
		suffix, ok := c.objects[key]
		if !ok {
			const letters = "abcdefghijklmnopqrstupvxyz" // sic, nodes.py
			var b [5]byte
			_, _ = rand.Read(b[:])
			for i := range b {
				b[i] = letters[int(b[i])%len(letters)]
			}
			suffix = "_temp_" + string(b[:])
			c.objects[key] = suffix
		}
		prefix += suffix
	}
	clean := comfyNormPath(prefix)
	sub, file := "", clean
	if i := strings.LastIndex(clean, "/"); i >= 0 {
		sub, file = clean[:i], clean[i+1:]
	}
	key := typ + "\x00" + sub + "\x00" + file
	images := []any{}
	for b := range r.it.graph.batch(n, map[string]bool{}) {
		c.counters[key]++
		name := strings.ReplaceAll(file, "%batch_num%", fmt.Sprint(b))
		images = append(images, jsonObj{
			{"filename", fmt.Sprintf("%s_%05d_.png", name, c.counters[key])}, {"subfolder", sub}, {"type", typ},
		})
	}
	return jsonObj{{"images", images}}
}

// comfyNormPath is os.path.normpath on posix, enough for a file prefix.
func comfyNormPath(p string) string {
	var parts []string
	for _, s := range strings.Split(p, "/") {
		switch s {
		case "", ".":
		case "..":
			if len(parts) > 0 && parts[len(parts)-1] != ".." {
				parts = parts[:len(parts)-1]
			} else if !strings.HasPrefix(p, "/") {
				parts = append(parts, s)
			}
		default:
			parts = append(parts, s)
		}
	}
	out := strings.Join(parts, "/")
	if strings.HasPrefix(p, "/") {
		out = "/" + out
	}
	if out == "" {
		return "."
	}
	return out
}

// comfyExecList is comfy_execution.graph.ExecutionList: the nodes still
// to run, each blocked by the uncached nodes it reads from.
type comfyExecList struct {
	g        *comfyGraph
	cached   func(string) bool
	pending  []string // insertion order
	in       map[string]bool
	count    map[string]int
	blocking map[string][]string // from → the nodes it blocks, in order
}

func newComfyExecList(g *comfyGraph, cached func(string) bool) *comfyExecList {
	return &comfyExecList{g: g, cached: cached, in: map[string]bool{}, count: map[string]int{}, blocking: map[string][]string{}}
}

func (l *comfyExecList) empty() bool { return len(l.pending) == 0 }

// add is TopologicalSort.add_node.
func (l *comfyExecList) add(id string) {
	type link struct{ from, to string }
	stack := []string{id}
	var links []link
	for len(stack) > 0 {
		u := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if l.in[u] {
			continue
		}
		l.in[u] = true
		l.pending = append(l.pending, u)
		l.count[u] = 0
		l.blocking[u] = nil
		for _, kv := range l.g.nodes[u].inputs {
			from, ok := comfyLink(kv.V)
			if !ok || l.g.nodes[from] == nil {
				continue
			}
			if !l.cached(from) {
				stack = append(stack, from)
			}
			links = append(links, link{from, u})
		}
	}
	for _, k := range links {
		if l.cached(k.from) {
			continue
		}
		l.add(k.from)
		if !slices.Contains(l.blocking[k.from], k.to) {
			l.blocking[k.from] = append(l.blocking[k.from], k.to)
			l.count[k.to]++
		}
	}
}

// stage is stage_node_execution with ux_friendly_pick_node; ok is false
// for a dependency cycle (id then names a node in it).
func (l *comfyExecList) stage() (id string, ok bool) {
	var ready []string
	for _, n := range l.pending {
		if l.count[n] == 0 {
			ready = append(ready, n)
		}
	}
	if len(ready) == 0 {
		return l.pending[0], false
	}
	for _, n := range ready {
		if l.g.output(n) {
			return n, true
		}
	}
	for _, n := range ready {
		for _, b := range l.blocking[n] {
			if l.g.output(b) {
				return n, true
			}
		}
	}
	for _, n := range ready {
		for _, b := range l.blocking[n] {
			for _, b1 := range l.blocking[b] {
				if l.g.output(b1) {
					return n, true
				}
			}
		}
	}
	return ready[0], true
}

// complete is complete_node_execution.
func (l *comfyExecList) complete(id string) {
	l.pending = slices.DeleteFunc(l.pending, func(n string) bool { return n == id })
	delete(l.in, id)
	for _, b := range l.blocking[id] {
		l.count[b]--
	}
	delete(l.blocking, id)
}

// waitChange is WaitFor: cond is called at once and after every close of
// *changed (read under mu, which notifyLocked closes and replaces), until
// it holds, ctx ends or done is closed (an error saying closed).
func waitChange(ctx context.Context, mu *sync.Mutex, changed *chan struct{}, done <-chan struct{}, closed string, cond func() bool) error {
	for {
		mu.Lock()
		ch := *changed
		mu.Unlock()
		if cond() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-done:
			return errors.New(closed)
		}
	}
}

// gbFlag is n bytes as a ComfyUI GB flag's value (GiB, as ComfyUI
// multiplies by 1024³).
func gbFlag(n uint64) string {
	return strconv.FormatFloat(float64(n)/(1<<30), 'f', -1, 64)
}
