package gguf

import (
	"errors"
	"fmt"
)

// Default sizes, used for the zero fields of Params. They give a model of
// about 115 KB that loads in well under a second on a CPU.
const (
	DefaultEmbedding   = 32
	DefaultBlocks      = 1
	DefaultFeedForward = 64
	DefaultHeads       = 4
	DefaultContext     = 256
)

// Upper bounds accepted by Validate. They keep a typo from asking for a
// model that would take minutes to generate or fill the disk.
const (
	MaxEmbedding   = 16384
	MaxBlocks      = 256
	MaxFeedForward = 65536
	MaxHeads       = 1024
	MaxContext     = 1 << 20
	// MaxSize is the largest file, in bytes, that Write produces.
	MaxSize = 4 << 30
)

// Params describes a random-weight llama model.
//
// The zero value of each size field means its default (DefaultEmbedding and
// so on; HeadsKV defaults to Heads). Negative values are invalid. The same
// Params always give the same bytes.
type Params struct {
	// Seed selects the random weights. Models with different seeds have
	// different digests, so Ollama treats them as different models.
	Seed int64

	Embedding   int // embedding length; a multiple of 2*Heads
	Blocks      int // transformer blocks
	FeedForward int // feed-forward length
	Heads       int // attention heads
	HeadsKV     int // key/value heads; must divide Heads
	Context     int // context length the model advertises
}

// Small returns the standard small preset: the default sizes, seed 1.
func Small() Params {
	return Params{Seed: 1}
}

// Large returns the standard large preset: twice the embedding, twice the
// feed-forward and twice the blocks of Small, a different seed, and a file
// about four times as big. Tests use Small and Large together to see model
// swaps.
func Large() Params {
	return Params{Seed: 2, Embedding: 64, Blocks: 2, FeedForward: 128, Heads: 4}
}

// Sentinel reasons for a *ParamError, matchable with errors.Is.
var (
	// ErrNegative: a size is below zero.
	ErrNegative = errors.New("must not be negative")
	// ErrTooLarge: a size or the whole file exceeds its limit.
	ErrTooLarge = errors.New("too large")
	// ErrShape: sizes that do not fit together (heads not dividing the
	// embedding, key/value heads not dividing heads, odd head dimension).
	ErrShape = errors.New("inconsistent shape")
)

// ParamError reports an invalid field of Params. Err is one of ErrNegative,
// ErrTooLarge or ErrShape.
type ParamError struct {
	Field  string // Params field name, or "size" for the whole file
	Value  int64  // the offending value, after defaults were applied
	Reason string // human-readable detail; may be empty
	Err    error
}

func (e *ParamError) Error() string {
	msg := fmt.Sprintf("gguf: %s %d: %v", e.Field, e.Value, e.Err)
	if e.Reason != "" {
		msg += ": " + e.Reason
	}
	return msg
}

func (e *ParamError) Unwrap() error { return e.Err }

// withDefaults returns p with its zero fields replaced by their defaults.
func (p Params) withDefaults() Params {
	if p.Embedding == 0 {
		p.Embedding = DefaultEmbedding
	}
	if p.Blocks == 0 {
		p.Blocks = DefaultBlocks
	}
	if p.FeedForward == 0 {
		p.FeedForward = DefaultFeedForward
	}
	if p.Heads == 0 {
		p.Heads = DefaultHeads
	}
	if p.HeadsKV == 0 {
		p.HeadsKV = p.Heads
	}
	if p.Context == 0 {
		p.Context = DefaultContext
	}
	return p
}

// Validate reports whether p, with defaults applied, describes a model that
// Write can produce and llama.cpp can load. The error is a *ParamError.
func Validate(p Params) error {
	_, err := resolve(p)
	return err
}

// Size returns the size in bytes of the file Write produces for p.
func Size(p Params) (int64, error) {
	q, err := resolve(p)
	if err != nil {
		return 0, err
	}
	l := newLayout(q)
	return l.size(), nil
}

// resolve applies defaults and validates.
func resolve(p Params) (Params, error) {
	for _, f := range []struct {
		name string
		v    int
	}{
		{"Embedding", p.Embedding},
		{"Blocks", p.Blocks},
		{"FeedForward", p.FeedForward},
		{"Heads", p.Heads},
		{"HeadsKV", p.HeadsKV},
		{"Context", p.Context},
	} {
		if f.v < 0 {
			return p, &ParamError{Field: f.name, Value: int64(f.v), Err: ErrNegative}
		}
	}
	q := p.withDefaults()
	for _, f := range []struct {
		name     string
		v, limit int
	}{
		{"Embedding", q.Embedding, MaxEmbedding},
		{"Blocks", q.Blocks, MaxBlocks},
		{"FeedForward", q.FeedForward, MaxFeedForward},
		{"Heads", q.Heads, MaxHeads},
		{"HeadsKV", q.HeadsKV, MaxHeads},
		{"Context", q.Context, MaxContext},
	} {
		if f.v > f.limit {
			return p, &ParamError{Field: f.name, Value: int64(f.v), Err: ErrTooLarge,
				Reason: fmt.Sprintf("limit %d", f.limit)}
		}
	}
	if q.Embedding%q.Heads != 0 {
		return p, &ParamError{Field: "Heads", Value: int64(q.Heads), Err: ErrShape,
			Reason: fmt.Sprintf("does not divide Embedding %d", q.Embedding)}
	}
	if (q.Embedding/q.Heads)%2 != 0 {
		return p, &ParamError{Field: "Heads", Value: int64(q.Heads), Err: ErrShape,
			Reason: fmt.Sprintf("head dimension %d (Embedding/Heads) must be even for RoPE", q.Embedding/q.Heads)}
	}
	if q.HeadsKV > q.Heads || q.Heads%q.HeadsKV != 0 {
		return p, &ParamError{Field: "HeadsKV", Value: int64(q.HeadsKV), Err: ErrShape,
			Reason: fmt.Sprintf("does not divide Heads %d", q.Heads)}
	}
	if n := newLayout(q).size(); n > MaxSize {
		return p, &ParamError{Field: "size", Value: n, Err: ErrTooLarge,
			Reason: fmt.Sprintf("limit %d bytes", int64(MaxSize))}
	}
	return q, nil
}
