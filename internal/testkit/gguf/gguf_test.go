package gguf

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"
)

// parsed is what readGGUF found in a file.
type parsed struct {
	version   uint32
	kvs       map[string]any
	tensors   []parsedTensor
	dataStart uint64
}

type parsedTensor struct {
	name   string
	dims   []uint64
	typ    uint32
	offset uint64
}

// reader is a strict little-endian GGUF reader for tests.
type reader struct {
	b   []byte
	pos uint64
	err error
}

func (r *reader) take(n uint64) []byte {
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b))-r.pos {
		r.err = fmt.Errorf("short read at %d: want %d bytes", r.pos, n)
		return nil
	}
	s := r.b[r.pos : r.pos+n]
	r.pos += n
	return s
}

func (r *reader) u32() uint32 {
	if s := r.take(4); s != nil {
		return binary.LittleEndian.Uint32(s)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if s := r.take(8); s != nil {
		return binary.LittleEndian.Uint64(s)
	}
	return 0
}

func (r *reader) str() string {
	n := r.u64()
	if n > 1<<20 {
		r.err = fmt.Errorf("string length %d at %d", n, r.pos)
		return ""
	}
	return string(r.take(n))
}

func (r *reader) value(typ uint32) any {
	switch typ {
	case valueUint32:
		return r.u32()
	case valueInt32:
		return int32(r.u32())
	case valueFloat32:
		return math.Float32frombits(r.u32())
	case valueString:
		return r.str()
	case valueArray:
		et := r.u32()
		n := r.u64()
		if n > 1<<20 {
			r.err = fmt.Errorf("array length %d", n)
			return nil
		}
		out := make([]any, 0, n)
		for range n {
			out = append(out, r.value(et))
		}
		return out
	default:
		r.err = fmt.Errorf("unexpected value type %d at %d", typ, r.pos)
		return nil
	}
}

func readGGUF(b []byte) (*parsed, error) {
	r := &reader{b: b}
	if m := r.take(4); r.err == nil && string(m) != magic {
		return nil, fmt.Errorf("bad magic %q", m)
	}
	p := &parsed{version: r.u32(), kvs: map[string]any{}}
	nt := r.u64()
	nkv := r.u64()
	if nt > 1<<16 || nkv > 1<<16 {
		return nil, fmt.Errorf("absurd counts %d tensors %d kvs", nt, nkv)
	}
	for range nkv {
		k := r.str()
		if _, dup := p.kvs[k]; dup {
			return nil, fmt.Errorf("duplicate key %q", k)
		}
		p.kvs[k] = r.value(r.u32())
	}
	for range nt {
		t := parsedTensor{name: r.str()}
		nd := r.u32()
		if nd > 4 {
			return nil, fmt.Errorf("tensor %q: %d dims", t.name, nd)
		}
		for range nd {
			t.dims = append(t.dims, r.u64())
		}
		t.typ = r.u32()
		t.offset = r.u64()
		p.tensors = append(p.tensors, t)
	}
	if r.err != nil {
		return nil, r.err
	}
	p.dataStart = align(r.pos)
	return p, nil
}

func (t parsedTensor) bytes() uint64 {
	n := uint64(4)
	for _, d := range t.dims {
		n *= d
	}
	return n
}

// floats returns the values of tensor t.
func (p *parsed) floats(b []byte, t parsedTensor) []float32 {
	start := p.dataStart + t.offset
	out := make([]float32, t.bytes()/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[start+uint64(4*i):]))
	}
	return out
}

func mustBytes(t *testing.T, p Params) []byte {
	t.Helper()
	b, err := Bytes(p)
	if err != nil {
		t.Fatalf("Bytes(%+v): %v", p, err)
	}
	return b
}

func TestDeterministic(t *testing.T) {
	a := mustBytes(t, Params{Seed: 7})
	b := mustBytes(t, Params{Seed: 7})
	if !bytes.Equal(a, b) {
		t.Fatal("same seed gave different bytes")
	}
	c := mustBytes(t, Params{Seed: 8})
	if bytes.Equal(a, c) {
		t.Fatal("different seeds gave the same bytes")
	}
	if len(a) != len(c) {
		t.Fatalf("same sizes, different seeds: %d vs %d bytes", len(a), len(c))
	}
	// Explicit defaults are the same as zero values.
	d := mustBytes(t, Params{Seed: 7, Embedding: DefaultEmbedding, Blocks: DefaultBlocks,
		FeedForward: DefaultFeedForward, Heads: DefaultHeads, HeadsKV: DefaultHeads, Context: DefaultContext})
	if !bytes.Equal(a, d) {
		t.Fatal("explicit defaults differ from zero values")
	}
}

// TestGolden pins the output so an accidental format change is noticed:
// models registered by older test runs keep their digests.
func TestGolden(t *testing.T) {
	for _, tc := range []struct {
		name   string
		p      Params
		size   int
		digest string
	}{
		{"small", Small(), 114848, "sha256:fe95b464b8d6d405f65e3a9ee440c20ac20ed1eeae6e20e0822eb3a822e6f9e2"},
		{"large", Large(), 469280, "sha256:7a27381f362df6fafdf2bba5696f16fb94c6bf8a96e92f10f91409018595732d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := mustBytes(t, tc.p)
			sum := sha256.Sum256(b)
			want := "sha256:" + hex.EncodeToString(sum[:])
			got, err := Digest(tc.p)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("Digest = %s, sha256(Bytes) = %s", got, want)
			}
			if len(b) != tc.size || got != tc.digest {
				t.Fatalf("%d bytes, %s; want %d bytes, %s", len(b), got, tc.size, tc.digest)
			}
		})
	}
}

func TestPresetsDiffer(t *testing.T) {
	s, err := Size(Small())
	if err != nil {
		t.Fatal(err)
	}
	l, err := Size(Large())
	if err != nil {
		t.Fatal(err)
	}
	if l < 2*s {
		t.Fatalf("Large (%d bytes) should be well above Small (%d bytes)", l, s)
	}
	if s > 200<<10 {
		t.Fatalf("Small is %d bytes; it should stay tiny", s)
	}
}

func TestParsesBack(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    Params
	}{
		{"default", Params{}},
		{"small", Small()},
		{"large", Large()},
		{"gqa", Params{Seed: 3, Embedding: 48, Heads: 6, HeadsKV: 2, FeedForward: 40, Blocks: 3, Context: 128}},
		{"unaligned", Params{Seed: 4, Embedding: 4, Heads: 2, HeadsKV: 1, FeedForward: 3, Blocks: 2, Context: 64}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := mustBytes(t, tc.p)
			q := tc.p.withDefaults()
			size, err := Size(tc.p)
			if err != nil {
				t.Fatal(err)
			}
			if int64(len(b)) != size {
				t.Fatalf("Size = %d, len(Bytes) = %d", size, len(b))
			}
			f, err := readGGUF(b)
			if err != nil {
				t.Fatal(err)
			}
			if f.version != 3 {
				t.Errorf("version %d", f.version)
			}
			wantU32 := map[string]uint32{
				"general.alignment":               32,
				"llama.context_length":            uint32(q.Context),
				"llama.embedding_length":          uint32(q.Embedding),
				"llama.block_count":               uint32(q.Blocks),
				"llama.feed_forward_length":       uint32(q.FeedForward),
				"llama.attention.head_count":      uint32(q.Heads),
				"llama.attention.head_count_kv":   uint32(q.HeadsKV),
				"llama.rope.dimension_count":      uint32(q.Embedding / q.Heads),
				"tokenizer.ggml.bos_token_id":     1,
				"tokenizer.ggml.eos_token_id":     2,
				"tokenizer.ggml.unknown_token_id": 0,
			}
			for k, want := range wantU32 {
				if got, ok := f.kvs[k].(uint32); !ok || got != want {
					t.Errorf("%s = %#v, want uint32 %d", k, f.kvs[k], want)
				}
			}
			if f.kvs["general.architecture"] != "llama" || f.kvs["tokenizer.ggml.model"] != "llama" {
				t.Errorf("architecture %v, tokenizer %v", f.kvs["general.architecture"], f.kvs["tokenizer.ggml.model"])
			}
			if eps, ok := f.kvs["llama.attention.layer_norm_rms_epsilon"].(float32); !ok || eps <= 0 {
				t.Errorf("layer_norm_rms_epsilon = %#v", f.kvs["llama.attention.layer_norm_rms_epsilon"])
			}
			checkTokenizer(t, f)
			checkTensors(t, f, b, q)
		})
	}
}

func checkTokenizer(t *testing.T, f *parsed) {
	t.Helper()
	tokens, _ := f.kvs["tokenizer.ggml.tokens"].([]any)
	scores, _ := f.kvs["tokenizer.ggml.scores"].([]any)
	types, _ := f.kvs["tokenizer.ggml.token_type"].([]any)
	if len(tokens) != vocabSize || len(scores) != vocabSize || len(types) != vocabSize {
		t.Fatalf("tokenizer arrays: %d tokens, %d scores, %d types; want %d", len(tokens), len(scores), len(types), vocabSize)
	}
	seen := map[string]bool{}
	for i, tok := range tokens {
		s := tok.(string)
		if seen[s] {
			t.Errorf("duplicate token %q", s)
		}
		seen[s] = true
		var want string
		var wantType int32
		switch {
		case i == 0:
			want, wantType = "<unk>", tokenUnknown
		case i == 1:
			want, wantType = "<s>", tokenControl
		case i == 2:
			want, wantType = "</s>", tokenControl
		default:
			want, wantType = fmt.Sprintf("<0x%02X>", i-3), tokenByte
		}
		if s != want || types[i].(int32) != wantType {
			t.Errorf("token %d = %q type %v, want %q type %d", i, s, types[i], want, wantType)
		}
	}
}

func checkTensors(t *testing.T, f *parsed, b []byte, q Params) {
	t.Helper()
	e, ff := uint64(q.Embedding), uint64(q.FeedForward)
	kvDim := e / uint64(q.Heads) * uint64(q.HeadsKV)
	want := map[string][]uint64{
		"token_embd.weight":  {e, vocabSize},
		"output_norm.weight": {e},
		"output.weight":      {e, vocabSize},
	}
	for i := range q.Blocks {
		for name, dims := range map[string][]uint64{
			"attn_norm": {e}, "attn_q": {e, e}, "attn_k": {e, kvDim}, "attn_v": {e, kvDim},
			"attn_output": {e, e}, "ffn_norm": {e}, "ffn_gate": {e, ff}, "ffn_up": {e, ff}, "ffn_down": {ff, e},
		} {
			want[fmt.Sprintf("blk.%d.%s.weight", i, name)] = dims
		}
	}
	if len(f.tensors) != len(want) {
		t.Errorf("%d tensors, want %d", len(f.tensors), len(want))
	}
	if f.dataStart%alignment != 0 {
		t.Errorf("data starts at %d, not aligned", f.dataStart)
	}
	seen := map[string]bool{}
	var next uint64
	for _, ti := range f.tensors {
		if seen[ti.name] {
			t.Errorf("duplicate tensor %q", ti.name)
		}
		seen[ti.name] = true
		if !slices.Equal(ti.dims, want[ti.name]) {
			t.Errorf("%s dims %v, want %v", ti.name, ti.dims, want[ti.name])
		}
		if ti.typ != typeF32 {
			t.Errorf("%s type %d, want F32", ti.name, ti.typ)
		}
		if ti.offset != next {
			t.Errorf("%s offset %d, want %d (contiguous, %d-byte padded)", ti.name, ti.offset, next, alignment)
		}
		next = align(ti.offset + ti.bytes())
	}
	if got, want := uint64(len(b)), f.dataStart+next; got != want {
		t.Errorf("file is %d bytes, want %d", got, want)
	}

	for _, ti := range f.tensors {
		v := f.floats(b, ti)
		switch {
		case ti.name == "token_embd.weight":
			for tok := range uint64(vocabSize) {
				if v[tok*e] != 1 {
					t.Fatalf("token_embd row %d component 0 = %v, want 1", tok, v[tok*e])
				}
			}
		case ti.name == "output.weight":
			for tok := range uint64(vocabSize) {
				c := v[tok*e]
				if tok < 3 && c != -10 || tok >= 3 && (c < -randomScale || c >= randomScale) {
					t.Fatalf("output row %d component 0 = %v", tok, c)
				}
			}
		case len(ti.dims) == 1:
			for i, x := range v {
				if x != 1 {
					t.Fatalf("%s[%d] = %v, want 1", ti.name, i, x)
				}
			}
		default:
			var nonzero bool
			for i, x := range v {
				if x < -randomScale || x >= randomScale {
					t.Fatalf("%s[%d] = %v out of range", ti.name, i, x)
				}
				nonzero = nonzero || x != 0
			}
			if !nonzero {
				t.Errorf("%s is all zero", ti.name)
			}
		}
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		p     Params
		field string
		want  error
	}{
		{"negative embedding", Params{Embedding: -1}, "Embedding", ErrNegative},
		{"negative blocks", Params{Blocks: -3}, "Blocks", ErrNegative},
		{"negative feed forward", Params{FeedForward: -1}, "FeedForward", ErrNegative},
		{"negative heads", Params{Heads: -4}, "Heads", ErrNegative},
		{"negative kv heads", Params{HeadsKV: -1}, "HeadsKV", ErrNegative},
		{"negative context", Params{Context: -256}, "Context", ErrNegative},
		{"heads do not divide embedding", Params{Embedding: 30, Heads: 4}, "Heads", ErrShape},
		{"odd head dimension", Params{Embedding: 12, Heads: 4}, "Heads", ErrShape},
		{"kv heads do not divide heads", Params{Heads: 4, HeadsKV: 3}, "HeadsKV", ErrShape},
		{"more kv heads than heads", Params{Heads: 2, HeadsKV: 4}, "HeadsKV", ErrShape},
		{"huge embedding", Params{Embedding: MaxEmbedding + 2}, "Embedding", ErrTooLarge},
		{"huge blocks", Params{Blocks: 1 << 30}, "Blocks", ErrTooLarge},
		{"huge context", Params{Context: math.MaxInt32}, "Context", ErrTooLarge},
		{"huge file", Params{Embedding: 8192, FeedForward: 32768, Blocks: 64}, "size", ErrTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.p)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Validate(%+v) = %v, want %v", tc.p, err, tc.want)
			}
			var pe *ParamError
			if !errors.As(err, &pe) || pe.Field != tc.field {
				t.Fatalf("error %v: want *ParamError for field %s", err, tc.field)
			}
			var buf bytes.Buffer
			if err := Write(&buf, tc.p); !errors.Is(err, tc.want) || buf.Len() != 0 {
				t.Fatalf("Write: err %v, wrote %d bytes", err, buf.Len())
			}
			if _, err := Bytes(tc.p); !errors.Is(err, tc.want) {
				t.Fatalf("Bytes: %v", err)
			}
		})
	}
	for _, p := range []Params{{}, Small(), Large(), {Embedding: 2, Heads: 1}} {
		if err := Validate(p); err != nil {
			t.Errorf("Validate(%+v) = %v", p, err)
		}
	}
}

type failWriter struct{ n int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.n -= len(p); w.n < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

func TestWriteError(t *testing.T) {
	for _, n := range []int{0, 100, 70 << 10} {
		if err := Write(&failWriter{n: n}, Small()); err == nil {
			t.Errorf("Write with a writer failing after %d bytes: no error", n)
		}
	}
}

func FuzzWrite(f *testing.F) {
	f.Add(int64(1), 32, 1, 64, 4, 4, 256)
	f.Add(int64(-5), 6, 2, 3, 3, 1, 1)
	f.Fuzz(func(t *testing.T, seed int64, e, blocks, ff, heads, kvHeads, ctx int) {
		// Keep generated files small; validation itself is exercised in full.
		p := Params{Seed: seed, Embedding: e % 130, Blocks: blocks % 4, FeedForward: ff % 130,
			Heads: heads % 17, HeadsKV: kvHeads % 17, Context: ctx}
		if err := Validate(p); err != nil {
			var pe *ParamError
			if !errors.As(err, &pe) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		b, err := Bytes(p)
		if err != nil {
			t.Fatal(err)
		}
		pf, err := readGGUF(b)
		if err != nil {
			t.Fatal(err)
		}
		checkTensors(t, pf, b, p.withDefaults())
	})
}
