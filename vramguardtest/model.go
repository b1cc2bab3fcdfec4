package vramguardtest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/ollama/ollama/api"
	omodel "github.com/ollama/ollama/types/model"
)

// Defaults used where a [ModelConfig] field is zero.
const (
	DefaultChunks        = 8
	DefaultContextLength = 4096
	DefaultModelSize     = 1 << 30 // 1 GiB
	// MinLoadDuration is the least time a load takes, whatever
	// LoadLatency: a load on Ollama takes 15 ms and more, and its reply
	// reports the time its handler waited for the runner, so that
	// vramguard's Options.LoadThreshold (10 ms) counts it as a load
	// (Generation.Loaded, the load hooks and metrics) out of the box. A
	// request that joined the load later reports the time from its own
	// arrival to the same end.
	MinLoadDuration = 20 * time.Millisecond
)

// ModelConfig describes a model the simulator knows, as if it had been
// pulled. Only Name is required; every other zero field means a default.
type ModelConfig struct {
	// Name is the model name as a user would pull it: "tiny", "tiny:latest",
	// "user/foo:q4". Names are resolved like Ollama does: "tiny" is
	// "tiny:latest", the default "library/" namespace is dropped from the
	// short name shown by /api/ps and /api/tags, and matching ignores case.
	Name string

	// Size is the model's total size in bytes (/api/ps "size").
	// Zero means SizeVRAM, or DefaultModelSize when both are zero.
	Size uint64

	// SizeVRAM is what the model holds on the simulated GPU while loading or
	// loaded (/api/ps "size_vram"). Zero means Size.
	SizeVRAM uint64

	// ContextLength is reported by /api/ps. Zero means DefaultContextLength.
	ContextLength int

	// LoadLatency is how long a load takes, at least MinLoadDuration. The
	// model is not listed by /api/ps before it has elapsed.
	LoadLatency time.Duration

	// TokenLatency is the delay before each response chunk.
	TokenLatency time.Duration

	// Chunks is how many chunks the default generator produces.
	// Zero means DefaultChunks. Ignored when Respond or RespondTo is set.
	Chunks int

	// Thinking marks a thinking model: the default generator then starts with
	// chunks that carry the "thinking" field, unless the request sets
	// "think": false. A request with "think": true for a model without
	// Thinking gets Ollama's 400 error.
	Thinking bool

	// Tools marks a model whose template supports tools: /api/show lists
	// the "tools" capability. A chat request with tools for a model without
	// Tools gets Ollama's 400 error "<full name> does not support tools"
	// before the model is loaded.
	Tools bool

	// Vision marks a model with a vision projector: /api/show lists the
	// "vision" capability. A request with images for a model without
	// Vision loads the model and then fails with 500, as Ollama's runner
	// does (see the package documentation for the text).
	Vision bool

	// Respond, if set, produces the chunks of a reply to prompt (for chat,
	// the content of the last message). The per-request option num_predict
	// caps how many are sent. It must be safe for concurrent use.
	// RespondTo, if set, is used instead.
	Respond func(prompt string) []Chunk

	// RespondTo, if set, produces the chunks of a reply to the request r,
	// for replies that depend on the messages, tools, format or images.
	// It is used instead of Respond; num_predict caps the chunks as for
	// Respond. It must be safe for concurrent use and must not modify r's
	// slices and maps, which [Server.Calls] shares.
	RespondTo func(r Call) []Chunk

	// Details is reported by /api/ps, /api/tags and /api/show.
	// A zero value reports a GGUF llama model.
	Details api.ModelDetails

	// Digest is reported by /api/ps and /api/tags. Empty means the SHA-256
	// of the short name, in hex.
	Digest string

	// ModelInfo, if set, is /api/show's model_info as is (tests of a
	// server that reports less). Nil means keys derived from Size: see
	// [Shape].
	ModelInfo map[string]any

	// Blob is the digest of the model's weights file, "sha256:<64 hex>",
	// which /api/show names in the modelfile's FROM line as
	// <ModelsDir>/blobs/sha256-<hex> (what a runner's --model names). Empty
	// means the SHA-256 of "weights of " and the short name. Models may
	// share one.
	Blob string
}

// ModelsDir is the models folder the simulator's /api/show paths name.
const ModelsDir = "/sim/.ollama/models"

// Chunk is one streamed piece of a reply.
type Chunk struct {
	Text     string // the "response" (generate) or message "content" (chat)
	Thinking string // the "thinking" field; dropped when the request disables thinking

	// ToolCalls go into the chat message's "tool_calls", each given an ID
	// ("call_" and 8 digits) if it has none, as Ollama does. Generate
	// replies drop them.
	ToolCalls []api.ToolCall
}

// modelName resolves name like Ollama: key is used for matching, short is
// what /api/ps and /api/tags show.
func modelName(name string) (key, short string, ok bool) {
	n := omodel.ParseName(name)
	if !n.IsValid() {
		return "", "", false
	}
	return strings.ToLower(n.String()), n.DisplayShortest(), true
}

// withDefaults returns cfg with its zero fields filled in.
func (cfg ModelConfig) withDefaults(short string) ModelConfig {
	switch {
	case cfg.Size == 0 && cfg.SizeVRAM == 0:
		cfg.Size, cfg.SizeVRAM = DefaultModelSize, DefaultModelSize
	case cfg.Size == 0:
		cfg.Size = cfg.SizeVRAM
	case cfg.SizeVRAM == 0:
		cfg.SizeVRAM = cfg.Size
	}
	if cfg.ContextLength <= 0 {
		cfg.ContextLength = DefaultContextLength
	}
	if cfg.Chunks <= 0 {
		cfg.Chunks = DefaultChunks
	}
	if cfg.Details.Format == "" && cfg.Details.Family == "" {
		cfg.Details = api.ModelDetails{
			Format:            "gguf",
			Family:            "llama",
			Families:          []string{"llama"},
			ParameterSize:     "1B",
			QuantizationLevel: "Q4_K_M",
		}
	}
	if cfg.Digest == "" {
		sum := sha256.Sum256([]byte(short))
		cfg.Digest = hex.EncodeToString(sum[:])
	}
	if cfg.Blob == "" {
		sum := sha256.Sum256([]byte("weights of " + short))
		cfg.Blob = "sha256:" + hex.EncodeToString(sum[:])
	}
	return cfg
}

// Shape is the architecture /api/show reports for a model without
// ModelInfo: a llama shape chosen by Size, so that a bigger model has more
// and wider blocks. Sizes up to 256 MiB get 8 blocks of 512 (8 heads, all
// key/value heads), up to 2 GiB the shape of a 1B model (16 × 2048, 32
// heads, 8 key/value heads), up to 6 GiB a 3B (28 × 3072, 24/8), bigger an
// 8B (32 × 4096, 32/8). The vocabulary is 32000 tokens.
type Shape struct {
	Blocks, Embedding, Heads, HeadsKV, Vocab int
}

// ShapeOf returns the shape /api/show derives from a model's Size.
func ShapeOf(size uint64) Shape {
	switch {
	case size <= 256<<20:
		return Shape{Blocks: 8, Embedding: 512, Heads: 8, HeadsKV: 8, Vocab: 32000}
	case size <= 2<<30:
		return Shape{Blocks: 16, Embedding: 2048, Heads: 32, HeadsKV: 8, Vocab: 32000}
	case size <= 6<<30:
		return Shape{Blocks: 28, Embedding: 3072, Heads: 24, HeadsKV: 8, Vocab: 32000}
	default:
		return Shape{Blocks: 32, Embedding: 4096, Heads: 32, HeadsKV: 8, Vocab: 32000}
	}
}

// modelInfo is /api/show's model_info for cfg (defaults applied).
func modelInfo(cfg ModelConfig) map[string]any {
	if cfg.ModelInfo != nil {
		return cfg.ModelInfo
	}
	arch := cfg.Details.Family
	if arch == "" {
		arch = "llama"
	}
	sh := ShapeOf(cfg.Size)
	return map[string]any{
		"general.architecture":            arch,
		"general.parameter_count":         cfg.Size,
		arch + ".context_length":          cfg.ContextLength,
		arch + ".block_count":             sh.Blocks,
		arch + ".embedding_length":        sh.Embedding,
		arch + ".attention.head_count":    sh.Heads,
		arch + ".attention.head_count_kv": sh.HeadsKV,
		arch + ".attention.key_length":    sh.Embedding / sh.Heads,
		arch + ".attention.value_length":  sh.Embedding / sh.Heads,
		arch + ".vocab_size":              sh.Vocab,
		"tokenizer.ggml.tokens":           nil, // as Ollama shows arrays without verbose
	}
}

// vocabulary is the word list of the default generator.
const vocabulary = "alpha bravo charlie delta echo foxtrot golf hotel " +
	"india juliet kilo lima mike november oscar papa"

// defaultResponse derives n words deterministically from prompt, preceded
// by thinking chunks when thinking is set.
func defaultResponse(prompt string, n int, thinking bool) []Chunk {
	var out []Chunk
	if thinking {
		out = thoughts()
	}
	for i, w := range words(prompt, n) {
		if i > 0 {
			w = " " + w
		}
		out = append(out, Chunk{Text: w})
	}
	return out
}

// words returns n words of the vocabulary, chosen by prompt.
func words(prompt string, n int) []string {
	vocab := strings.Fields(vocabulary)
	h := fnv.New32a()
	h.Write([]byte(prompt))
	seed := int(h.Sum32() % uint32(len(vocab)))
	out := make([]string, n)
	for i := range out {
		out[i] = vocab[(seed+i)%len(vocab)]
	}
	return out
}

// thoughts returns the thinking chunks of the default generators.
func thoughts() []Chunk {
	out := make([]Chunk, 3)
	for i := range out {
		out[i] = Chunk{Thinking: fmt.Sprintf("thought %d. ", i+1)}
	}
	return out
}
