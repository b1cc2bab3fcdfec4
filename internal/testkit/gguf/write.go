package gguf

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// Format constants (GGUF version 3, little-endian).
const (
	magic     = "GGUF"
	version   = 3
	alignment = 32
	typeF32   = 0 // ggml tensor type F32
)

// GGUF metadata value types.
const (
	valueUint32  = 4
	valueInt32   = 5
	valueFloat32 = 6
	valueString  = 8
	valueArray   = 9
)

// Token types from llama.cpp's llama_token_type.
const (
	tokenUnknown = 2
	tokenControl = 3
	tokenByte    = 6
)

// Special token IDs; the vocabulary is <unk>, <s>, </s>, then the 256 bytes.
const (
	tokenIDUnk = 0
	tokenIDBOS = 1
	tokenIDEOS = 2
	vocabSize  = 3 + 256
)

// tensorFill says how a tensor's values are chosen.
type tensorFill uint8

const (
	fillOnes   tensorFill = iota // norm weights
	fillRandom                   // small random values
	fillEmbed                    // random, component 0 of every row is 1
	fillOutput                   // random, component 0 of rows 0-2 is -10
)

// randomScale bounds the random weights: uniform in [-randomScale, randomScale).
const randomScale = 0.05

type tensor struct {
	name   string
	dims   []uint64 // ggml order: dims[0] varies fastest
	fill   tensorFill
	offset uint64 // from the start of the data section
}

func (t tensor) elems() uint64 {
	n := uint64(1)
	for _, d := range t.dims {
		n *= d
	}
	return n
}

func (t tensor) bytes() uint64 { return 4 * t.elems() }

type kv struct {
	key   string
	value any // uint32, float32, string, []string, []float32 or []int32
}

// layout is everything about a file except the tensor values.
type layout struct {
	p        Params
	kvs      []kv
	tensors  []tensor
	header   []byte // magic through the last tensor info, unpadded
	dataSize uint64 // tensor data including padding after each tensor
}

func align(n uint64) uint64 { return (n + alignment - 1) / alignment * alignment }

// newLayout builds the metadata and tensor table for p, which must already
// have its defaults applied and be valid.
func newLayout(p Params) *layout {
	e := uint64(p.Embedding)
	f := uint64(p.FeedForward)
	headDim := e / uint64(p.Heads)
	kvDim := headDim * uint64(p.HeadsKV)
	v := uint64(vocabSize)

	tokens := make([]string, 0, vocabSize)
	types := make([]int32, 0, vocabSize)
	tokens = append(tokens, "<unk>", "<s>", "</s>")
	types = append(types, tokenUnknown, tokenControl, tokenControl)
	for b := range 256 {
		tokens = append(tokens, fmt.Sprintf("<0x%02X>", b))
		types = append(types, tokenByte)
	}

	l := &layout{p: p}
	l.kvs = []kv{
		{"general.architecture", "llama"},
		{"general.name", "vramguard-tiny"},
		{"general.alignment", uint32(alignment)},
		{"llama.context_length", uint32(p.Context)},
		{"llama.embedding_length", uint32(p.Embedding)},
		{"llama.block_count", uint32(p.Blocks)},
		{"llama.feed_forward_length", uint32(p.FeedForward)},
		{"llama.attention.head_count", uint32(p.Heads)},
		{"llama.attention.head_count_kv", uint32(p.HeadsKV)},
		// Required: without it llama.cpp fails to load the model.
		{"llama.attention.layer_norm_rms_epsilon", float32(1e-5)},
		{"llama.rope.dimension_count", uint32(headDim)},
		{"tokenizer.ggml.model", "llama"},
		{"tokenizer.ggml.tokens", tokens},
		{"tokenizer.ggml.scores", make([]float32, vocabSize)},
		{"tokenizer.ggml.token_type", types},
		{"tokenizer.ggml.bos_token_id", uint32(tokenIDBOS)},
		{"tokenizer.ggml.eos_token_id", uint32(tokenIDEOS)},
		{"tokenizer.ggml.unknown_token_id", uint32(tokenIDUnk)},
	}

	l.tensors = []tensor{
		{name: "token_embd.weight", dims: []uint64{e, v}, fill: fillEmbed},
		{name: "output_norm.weight", dims: []uint64{e}, fill: fillOnes},
		{name: "output.weight", dims: []uint64{e, v}, fill: fillOutput},
	}
	for i := range p.Blocks {
		blk := func(name string, fill tensorFill, dims ...uint64) tensor {
			return tensor{name: fmt.Sprintf("blk.%d.%s.weight", i, name), dims: dims, fill: fill}
		}
		l.tensors = append(l.tensors,
			blk("attn_norm", fillOnes, e),
			blk("attn_q", fillRandom, e, e),
			blk("attn_k", fillRandom, e, kvDim),
			blk("attn_v", fillRandom, e, kvDim),
			blk("attn_output", fillRandom, e, e),
			blk("ffn_norm", fillOnes, e),
			blk("ffn_gate", fillRandom, e, f),
			blk("ffn_up", fillRandom, e, f),
			blk("ffn_down", fillRandom, f, e),
		)
	}
	var off uint64
	for i := range l.tensors {
		l.tensors[i].offset = off
		off = align(off + l.tensors[i].bytes())
	}
	l.dataSize = off

	var h bytes.Buffer
	h.WriteString(magic)
	le := func(v any) { _ = binary.Write(&h, binary.LittleEndian, v) }
	le(uint32(version))
	le(uint64(len(l.tensors)))
	le(uint64(len(l.kvs)))
	str := func(s string) {
		le(uint64(len(s)))
		h.WriteString(s)
	}
	for _, m := range l.kvs {
		str(m.key)
		switch x := m.value.(type) {
		case uint32:
			le(uint32(valueUint32))
			le(x)
		case float32:
			le(uint32(valueFloat32))
			le(x)
		case string:
			le(uint32(valueString))
			str(x)
		case []string:
			le(uint32(valueArray))
			le(uint32(valueString))
			le(uint64(len(x)))
			for _, s := range x {
				str(s)
			}
		case []float32:
			le(uint32(valueArray))
			le(uint32(valueFloat32))
			le(uint64(len(x)))
			le(x)
		case []int32:
			le(uint32(valueArray))
			le(uint32(valueInt32))
			le(uint64(len(x)))
			le(x)
		default:
			panic(fmt.Sprintf("gguf: unsupported metadata type %T", x))
		}
	}
	for _, t := range l.tensors {
		str(t.name)
		le(uint32(len(t.dims)))
		le(t.dims)
		le(uint32(typeF32))
		le(t.offset)
	}
	l.header = h.Bytes()
	return l
}

// size is the total file size.
func (l *layout) size() int64 { return int64(align(uint64(len(l.header))) + l.dataSize) }

// Write writes the GGUF file described by p to w. It validates p first
// (see Validate) and writes nothing if p is invalid. The output depends only
// on p.
func Write(w io.Writer, p Params) error {
	q, err := resolve(p)
	if err != nil {
		return err
	}
	l := newLayout(q)
	bw := bufio.NewWriterSize(w, 64<<10)
	if _, err := bw.Write(l.header); err != nil {
		return err
	}
	if err := pad(bw, uint64(len(l.header))); err != nil {
		return err
	}
	rng := splitmix64(uint64(q.Seed))
	e := uint64(q.Embedding)
	var buf [4096]byte
	for _, t := range l.tensors {
		n := t.elems()
		for i := uint64(0); i < n; {
			k := 0
			for ; k < len(buf) && i < n; k, i = k+4, i+1 {
				binary.LittleEndian.PutUint32(buf[k:], math.Float32bits(value(t.fill, i, e, &rng)))
			}
			if _, err := bw.Write(buf[:k]); err != nil {
				return err
			}
		}
		if err := pad(bw, t.bytes()); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// Bytes returns the GGUF file described by p.
func Bytes(p Params) ([]byte, error) {
	n, err := Size(p)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Grow(int(n))
	if err := Write(&b, p); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// value returns element i of a tensor filled with fill, whose rows have e
// elements. Random values consume the generator in element order, so the
// file is the same for the same seed.
//
// Setting component 0 of every token embedding to 1 and component 0 of the
// output rows of <unk>, <s> and </s> to -10 gives those three tokens a logit
// far below every byte token: </s> is never sampled, so num_predict is
// honoured exactly.
func value(fill tensorFill, i, e uint64, rng *splitmix64) float32 {
	switch fill {
	case fillOnes:
		return 1
	case fillEmbed:
		r := rng.float()
		if i%e == 0 {
			return 1
		}
		return r
	case fillOutput:
		r := rng.float()
		if i%e == 0 && i/e < 3 {
			return -10
		}
		return r
	default:
		return rng.float()
	}
}

var zeros [alignment]byte

// pad writes the zero bytes that bring n up to a multiple of the alignment.
func pad(w io.Writer, n uint64) error {
	_, err := w.Write(zeros[:align(n)-n])
	return err
}

// splitmix64 is a tiny generator whose output is fixed by its definition,
// unlike math/rand's, which Go releases may change.
type splitmix64 uint64

func (s *splitmix64) next() uint64 {
	*s += 0x9e3779b97f4a7c15
	z := uint64(*s)
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// float returns a value uniform in [-randomScale, randomScale).
func (s *splitmix64) float() float32 {
	u := float32(s.next()>>40) / (1 << 24) // [0, 1)
	return (2*u - 1) * randomScale
}
