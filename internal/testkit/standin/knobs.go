package standin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Environment variables the stand-in reads. Ollama passes its own
// environment to the llama-server processes it starts, so setting them on
// `ollama serve` reaches every runner.
const (
	// EnvControl names the JSON file holding the Knobs. Unset, or a file
	// that does not exist, means the defaults.
	EnvControl = "VRAMGUARD_STANDIN_CONTROL"
	// EnvLog names a file to which the stand-in appends one JSON line (an
	// Event) per process start, per HTTP request and per exit it causes
	// itself. Unset means no log.
	EnvLog = "VRAMGUARD_STANDIN_LOG"
)

// Defaults for the zero fields of Knobs.
const (
	DefaultLoadMS   = 50 // how long /health says "Loading model"
	DefaultTokenMS  = 2  // delay before each generated token
	DefaultEOSAfter = 24 // tokens the model generates before end-of-sequence
)

// Hang selects a phase in which the stand-in stops making progress.
type Hang string

const (
	// HangNone: no hang.
	HangNone Hang = ""
	// HangLoad: /health answers "Loading model" forever.
	HangLoad Hang = "load"
	// HangCompletion: completion and chat requests are accepted and get no
	// answer at all (not even headers) until the client goes away.
	HangCompletion Hang = "completion"
)

// Knobs control the stand-in's timing and failures. The zero value of every
// field means its default, so the zero Knobs is a well-behaved llama-server.
//
// The stand-in reads the file named by EnvControl when the process starts
// (load behaviour: LoadMS, Hang "load", OOMAtLoad, OOMHealth, ExitAtLoad,
// ModelBytes, DeviceBytes) and again at every completion and chat request
// (generation behaviour: TokenMS, EOSAfter, CrashAfterTokens, Hang
// "completion"). A
// change therefore affects the next request of a running runner and the
// next load.
type Knobs struct {
	// LoadMS is how long, in milliseconds, the model takes to load: /health
	// answers 503 "Loading model" for that long. Zero means DefaultLoadMS;
	// negative means no delay. Ollama v0.34.4 polls /health every 250 ms,
	// so it sees the load end at its first poll after LoadMS.
	LoadMS int `json:"load_ms,omitempty"`

	// TokenMS is the delay, in milliseconds, before each generated token.
	// Zero means DefaultTokenMS; negative means no delay.
	TokenMS int `json:"token_ms,omitempty"`

	// EOSAfter is how many tokens the model generates before it ends the
	// sequence by itself (stop_type "eos", Ollama's done_reason "stop"). A
	// request with 0 < n_predict <= EOSAfter gets exactly n_predict tokens
	// and stop_type "limit" (done_reason "length"). Zero means
	// DefaultEOSAfter.
	EOSAfter int `json:"eos_after,omitempty"`

	// CrashAfterTokens, when positive, makes the process abort once it has
	// streamed that many tokens of one completion or chat request: it writes
	// a GGML_ASSERT line to stderr, cuts the connection without ending the
	// response, and exits with status 134 (the status of SIGABRT in a
	// shell). A request that ends before that many tokens is not affected.
	CrashAfterTokens int `json:"crash_after_tokens,omitempty"`

	// OOMAtLoad makes the load fail, at the end of LoadMS, with the stderr
	// lines llama.cpp writes when a CUDA allocation fails
	// ("cudaMalloc failed: out of memory", ...; the allocation is
	// ModelBytes, or 1 GiB), after which the process exits with status 1
	// (see OOMHealth for the alternative). Ollama v0.34.4 answers HTTP 500
	// "llama-server process has terminated: exit status 1: cudaMalloc
	// failed: out of memory\n...". When other models are loaded, Ollama
	// first unloads them all and retries the load once (server/sched.go).
	OOMAtLoad bool `json:"oom_at_load,omitempty"`

	// OOMHealth, with OOMAtLoad, keeps the process running after the
	// out-of-memory lines and makes /health answer HTTP 500 with an error
	// instead of exiting. Ollama v0.34.4 then reports "llama-server
	// reported out-of-memory during startup: ..." rather than
	// "llama-server process has terminated: ...".
	OOMHealth bool `json:"oom_health,omitempty"`

	// ExitAtLoad makes the load fail, at the end of LoadMS, with one plain
	// llama.cpp load error line, after which the process exits with
	// status 1.
	ExitAtLoad bool `json:"exit_at_load,omitempty"`

	// Hang makes the stand-in stop making progress in one phase.
	Hang Hang `json:"hang,omitempty"`

	// ModelBytes is the model size reported in the "CPU model buffer size
	// = X MiB" line, which is the size Ollama shows in /api/ps. The line
	// has two decimals, as llama.cpp's, so Ollama reads
	// floor(round(ModelBytes/MiB, 2) * MiB) bytes: a multiple of 1 MiB is
	// reported exactly. Zero means the size of the --model file.
	ModelBytes int64 `json:"model_bytes,omitempty"`

	// DeviceBytes, when positive, makes the runner allocate that many
	// bytes of device memory on CUDA device 0 at the end of its load and
	// hold them until it exits, through the CUDA driver API opened at run
	// time (libcuda.so.1; see HoldDeviceMemory), so that the GPU's own
	// figures (NVML, nvidia-smi) show a runner that really holds VRAM.
	// Without a GPU, or in a stand-in built without cgo, it logs a
	// "no GPU" warning and loads without device memory; a GPU that
	// refuses the allocation fails the load as OOMAtLoad does. Ollama is
	// not told: the stand-in lists no devices, so /api/ps shows size_vram
	// 0 whatever the driver says.
	DeviceBytes int64 `json:"device_bytes,omitempty"`

	// Models holds overrides per model: a runner whose --model path
	// contains the key (for example the hex digits of a blob digest) uses
	// the key's non-zero fields instead of the global ones. When several
	// keys match, the longest wins (then the lexically smallest). Models
	// inside an override are ignored.
	Models map[string]Knobs `json:"models,omitempty"`
}

// Validate reports a Hang value the stand-in does not know and negative
// counts or sizes.
func (k Knobs) Validate() error {
	var errs []error
	check := func(where string, k Knobs) {
		switch k.Hang {
		case HangNone, HangLoad, HangCompletion:
		default:
			errs = append(errs, fmt.Errorf("standin: knobs%s: unknown hang %q (want %q, %q or %q)", where, k.Hang, HangNone, HangLoad, HangCompletion))
		}
		if k.EOSAfter < 0 {
			errs = append(errs, fmt.Errorf("standin: knobs%s: negative eos_after %d", where, k.EOSAfter))
		}
		if k.CrashAfterTokens < 0 {
			errs = append(errs, fmt.Errorf("standin: knobs%s: negative crash_after_tokens %d", where, k.CrashAfterTokens))
		}
		if k.ModelBytes < 0 {
			errs = append(errs, fmt.Errorf("standin: knobs%s: negative model_bytes %d", where, k.ModelBytes))
		}
		if k.DeviceBytes < 0 {
			errs = append(errs, fmt.Errorf("standin: knobs%s: negative device_bytes %d", where, k.DeviceBytes))
		}
	}
	check("", k)
	for _, key := range slices.Sorted(maps.Keys(k.Models)) {
		if key == "" {
			errs = append(errs, errors.New("standin: knobs: empty key in models"))
		}
		check(fmt.Sprintf(" models[%q]", key), k.Models[key])
	}
	return errors.Join(errs...)
}

// ForModel returns the knobs that apply to a runner of modelPath: the
// global fields overridden by the non-zero fields of the best matching
// entry of Models (see Models). The result has no Models.
func (k Knobs) ForModel(modelPath string) Knobs {
	out := k
	out.Models = nil
	if modelPath == "" || len(k.Models) == 0 {
		return out
	}
	best, found := "", false
	for key := range k.Models {
		if key == "" || !strings.Contains(modelPath, key) {
			continue
		}
		if !found || len(key) > len(best) || (len(key) == len(best) && key < best) {
			best, found = key, true
		}
	}
	if !found {
		return out
	}
	o := k.Models[best]
	if o.LoadMS != 0 {
		out.LoadMS = o.LoadMS
	}
	if o.TokenMS != 0 {
		out.TokenMS = o.TokenMS
	}
	if o.EOSAfter != 0 {
		out.EOSAfter = o.EOSAfter
	}
	if o.CrashAfterTokens != 0 {
		out.CrashAfterTokens = o.CrashAfterTokens
	}
	out.OOMAtLoad = out.OOMAtLoad || o.OOMAtLoad
	out.OOMHealth = out.OOMHealth || o.OOMHealth
	out.ExitAtLoad = out.ExitAtLoad || o.ExitAtLoad
	if o.Hang != HangNone {
		out.Hang = o.Hang
	}
	if o.ModelBytes != 0 {
		out.ModelBytes = o.ModelBytes
	}
	if o.DeviceBytes != 0 {
		out.DeviceBytes = o.DeviceBytes
	}
	return out
}

func millis(v, def int) time.Duration {
	switch {
	case v == 0:
		return time.Duration(def) * time.Millisecond
	case v < 0:
		return 0
	}
	return time.Duration(v) * time.Millisecond
}

func (k Knobs) loadDelay() time.Duration  { return millis(k.LoadMS, DefaultLoadMS) }
func (k Knobs) tokenDelay() time.Duration { return millis(k.TokenMS, DefaultTokenMS) }

func (k Knobs) eosAfter() int {
	if k.EOSAfter <= 0 {
		return DefaultEOSAfter
	}
	return k.EOSAfter
}

// ReadKnobs reads knobs from the JSON file at path. An empty path or a file
// that does not exist gives the zero Knobs and no error. Unknown fields and
// values Validate rejects are errors.
func ReadKnobs(path string) (Knobs, error) {
	if path == "" {
		return Knobs{}, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Knobs{}, nil
	}
	if err != nil {
		return Knobs{}, fmt.Errorf("standin: read knobs: %w", err)
	}
	return parseKnobs(b)
}

func parseKnobs(b []byte) (Knobs, error) {
	var k Knobs
	if len(bytes.TrimSpace(b)) == 0 {
		return k, nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&k); err != nil {
		return Knobs{}, fmt.Errorf("standin: parse knobs: %w", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return Knobs{}, errors.New("standin: parse knobs: data after the JSON object")
	}
	if err := k.Validate(); err != nil {
		return Knobs{}, err
	}
	return k, nil
}

// WriteKnobs validates k and writes it to path atomically: it writes a
// temporary file in the same folder and renames it over path, so a
// stand-in reading the file concurrently sees either the old or the new
// knobs, never a partial file.
func WriteKnobs(path string, k Knobs) error {
	if err := k.Validate(); err != nil {
		return err
	}
	b, err := json.MarshalIndent(k, "", "  ")
	if err != nil {
		return fmt.Errorf("standin: write knobs: %w", err)
	}
	b = append(b, '\n')
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("standin: write knobs: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("standin: write knobs: %w", err)
	}
	return nil
}

// knobSource reads the knobs of one runner process. It warns on stderr once
// per distinct problem and then uses the defaults, because a stand-in that
// cannot read its knobs should still behave like a llama-server.
type knobSource struct {
	path, model string
	log         *logger

	mu      sync.Mutex
	lastErr string
}

// noErrorPrefix defuses the texts Ollama's StatusWriter takes for a
// runner's error (llm/status.go) in the stand-in's own warnings.
var noErrorPrefix = strings.NewReplacer("error:", "error -", "Error:", "Error -", "panic:", "panic -")

func (s *knobSource) current() Knobs {
	k, err := ReadKnobs(s.path)
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		if msg := err.Error(); msg != s.lastErr {
			s.lastErr = msg
			// No "error:" in the line: Ollama would report it as the
			// runner's last error.
			s.log.linef("warn: vramguard stand-in: using default knobs (%s)", noErrorPrefix.Replace(msg))
		}
		return Knobs{}
	}
	s.lastErr = ""
	return k.ForModel(s.model)
}
