package vramguard

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/ollama/ollama/api"
)

// defaultEstimateNumCtx is the context length EstimateModel uses when asked
// for 0 and the model's parameters set no num_ctx: the default of Ollama
// v0.17 and later on a machine with less than 23 GiB of VRAM (v0.6.5's is
// 2048, so the estimate is then high, never low).
const defaultEstimateNumCtx = 4096

// ModelEstimate is what a model needs on the device at one context length.
type ModelEstimate struct {
	Model string
	// NumCtx is the context length estimated for: the one asked, or, when 0
	// was asked, the model's own num_ctx parameter, else
	// 4096. It is the server's whole context: a server
	// that serves N requests of a model in parallel allocates N × num_ctx
	// (OLLAMA_NUM_PARALLEL; v0.6.5 on a CPU defaults to 4, later versions
	// to 1), so ask for that. It is not capped at the model's trained
	// context (Ollama v0.17 and later cap it, v0.6.5 does not), so asking
	// for more than the model was trained on gives a high estimate.
	NumCtx  int
	Weights int64 // bytes: the weights file(s) as /api/tags reports them
	KVCache int64 // bytes: K and V caches at NumCtx, f16 (a server set to a quantized cache needs less)
	Compute int64 // bytes: compute/graph buffers (a documented heuristic)
	Total   int64 // Weights + KVCache + Compute
}

// EstimateModel estimates, before any load, what model needs on the device
// at numCtx tokens of context (0: see ModelEstimate.NumCtx). It reads only
// what the server reports about the model (/api/show's model_info and the
// size in /api/tags), so it works against a remote server and loads
// nothing. Measured against the servers of the test suite (BENCHMARKS.md)
// it is at most 3.3% below what Ollama reports in /api/ps "size" after the
// load, and often far above: it counts the whole file and a compute graph
// that CPU servers leave out.
//
// The formula, from the model's architecture keys:
//
//	KVCache = NumCtx × block_count × head_count_kv × (key_length + value_length) × 2 bytes
//	Compute = max(4·b·(1 + 4·embedding + NumCtx·(1 + head_count)), 4·b·(embedding + vocab))
//	          with b = min(NumCtx, 512), the batch Ollama defaults to
//
// Compute is Ollama's own graph-size estimate for llama models (fs/ggml,
// fully offloaded). head_count_kv defaults to head_count, key_length and
// value_length to embedding/head_count, as in llama.cpp; vocab is
// <arch>.vocab_size when the server reports it, else the length of the token
// list when it is shown, else the logits term is left out.
//
// Failures: KindInvalidInput for an empty or malformed name or numCtx < 0
// (nothing sent); KindNotFound for a model the server does not have;
// KindServer when model_info lacks what the estimate needs or /api/tags
// does not list the model; ErrClosed (KindUnavailable) on a closed client;
// KindCanceled with context.Cause(ctx) when ctx is done. Safe for
// concurrent use.
func (c *OllamaClient) EstimateModel(ctx context.Context, model string, numCtx int) (*ModelEstimate, error) {
	const op = "estimate"
	if err := validModelName(op, model); err != nil {
		return nil, err
	}
	if numCtx < 0 {
		return nil, invalid(op, model, "num_ctx %d is negative", numCtx)
	}
	if err := c.checkOpen(op, model); err != nil {
		return nil, err
	}
	show, err := c.api.Show(ctx, &api.ShowRequest{Model: model})
	if err != nil {
		return nil, c.callError(ctx, op, model, err)
	}
	shape, err := readShape(show.ModelInfo)
	if err != nil {
		return nil, newError(op, model, KindServer, err)
	}
	list, err := c.api.List(ctx)
	if err != nil {
		return nil, c.callError(ctx, op, model, err)
	}
	want := NormalizeModelName(model)
	weights := int64(-1)
	for _, m := range list.Models {
		if NormalizeModelName(m.Model) == want || NormalizeModelName(m.Name) == want {
			weights = m.Size
			break
		}
	}
	if weights < 0 {
		return nil, newError(op, model, KindServer, errors.New("/api/tags does not list the model"))
	}
	if numCtx == 0 {
		numCtx = cmp.Or(paramNumCtx(show.Parameters), defaultEstimateNumCtx)
	}
	e := &ModelEstimate{Model: model, NumCtx: numCtx, Weights: weights}
	e.KVCache, e.Compute = shape.kvCache(numCtx), shape.compute(numCtx)
	e.Total = satAdd(e.Weights, e.KVCache, e.Compute)
	return e, nil
}

// satMul and satAdd saturate at math.MaxInt64 (negative terms count as
// zero): a huge num_ctx or a hostile model_info gives a huge estimate,
// never a negative or a small one.
func satMul(xs ...int64) int64 {
	f, p := 1.0, int64(1)
	for _, x := range xs {
		x = max(x, 0)
		f *= float64(x)
		if f >= math.MaxInt64/2 { // float64 rounding leaves a margin
			return math.MaxInt64
		}
		p *= x
	}
	return p
}

func satAdd(xs ...int64) int64 {
	var sum int64
	for _, x := range xs {
		x = max(x, 0)
		if sum > math.MaxInt64-x {
			return math.MaxInt64
		}
		sum += x
	}
	return sum
}

// modelShape is the part of a model's architecture the estimate uses.
type modelShape struct {
	blocks, embedding, heads, headsKV, keyLen, valueLen, vocab int64
}

// f16 K and V caches, as Ollama allocates them by default.
func (s modelShape) kvCache(numCtx int) int64 {
	return satMul(int64(numCtx), s.blocks, s.headsKV, satAdd(s.keyLen, s.valueLen), 2)
}

// compute is Ollama's graph estimate for llama (fs/ggml GraphSize,
// fullOffload), batch min(num_ctx, 512).
func (s modelShape) compute(numCtx int) int64 {
	n := int64(numCtx)
	b := min(n, 512)
	per := satAdd(satMul(4, s.embedding), 1, satMul(n, satAdd(s.heads, 1)))
	return max(satMul(4, b, per), satMul(4, b, satAdd(s.embedding, s.vocab)))
}

// readShape reads the architecture keys of /api/show's model_info.
func readShape(info map[string]any) (modelShape, error) {
	arch, _ := info["general.architecture"].(string)
	if arch == "" {
		return modelShape{}, errors.New("model_info has no general.architecture")
	}
	var s modelShape
	var missing []string
	need := func(key string) int64 {
		v, ok := infoInt(info[arch+"."+key])
		if !ok || v <= 0 {
			missing = append(missing, arch+"."+key)
		}
		return v
	}
	s.blocks = need("block_count")
	s.embedding = need("embedding_length")
	s.heads = need("attention.head_count")
	if len(missing) > 0 {
		return modelShape{}, fmt.Errorf("model_info lacks %s, which the estimate needs", strings.Join(missing, ", "))
	}
	opt := func(key string, def int64) int64 {
		if v, ok := infoInt(info[arch+"."+key]); ok && v > 0 {
			return v
		}
		return def
	}
	s.headsKV = opt("attention.head_count_kv", s.heads)
	s.keyLen = opt("attention.key_length", s.embedding/s.heads)
	s.valueLen = opt("attention.value_length", s.embedding/s.heads)
	s.vocab = opt("vocab_size", 0)
	if toks, ok := info["tokenizer.ggml.tokens"].([]any); ok && s.vocab == 0 {
		s.vocab = int64(len(toks))
	}
	return s, nil
}

// infoInt reads a model_info number. Per-layer arrays (some architectures
// vary head_count_kv by layer) give their largest element.
func infoInt(v any) (int64, bool) {
	switch v := v.(type) {
	case float64:
		return int64(v), v == float64(int64(v))
	case json.Number:
		n, err := v.Int64()
		return n, err == nil
	case int:
		return int64(v), true
	case int64:
		return v, true
	case uint64:
		return int64(v), true
	case []any:
		var m int64
		ok := len(v) > 0
		for _, e := range v {
			n, isInt := infoInt(e)
			ok = ok && isInt
			m = max(m, n)
		}
		return m, ok
	}
	return 0, false
}

// paramNumCtx returns the num_ctx of /api/show's parameters text (lines of
// "name value"), 0 when it sets none.
func paramNumCtx(params string) int {
	for line := range strings.Lines(params) {
		name, val, ok := strings.Cut(strings.TrimSpace(line), " ")
		if ok && name == "num_ctx" {
			if n, err := strconv.Atoi(strings.Trim(strings.TrimSpace(val), `"`)); err == nil && n > 0 {
				return n
			}
		}
	}
	return 0
}
