package gguf_test

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/vramguard/vramguard/internal/testkit/gguf"
)

func ExampleWrite() {
	var buf bytes.Buffer
	if err := gguf.Write(&buf, gguf.Params{Seed: 42}); err != nil {
		panic(err)
	}
	fmt.Printf("%s v%d, %d bytes\n", buf.Bytes()[:4], buf.Bytes()[4], buf.Len())
	// Output: GGUF v3, 114848 bytes
}

func ExampleSize() {
	for _, p := range []gguf.Params{gguf.Small(), gguf.Large()} {
		n, err := gguf.Size(p)
		if err != nil {
			panic(err)
		}
		fmt.Println(n)
	}
	// Output:
	// 114848
	// 469280
}

func ExampleValidate() {
	err := gguf.Validate(gguf.Params{Embedding: 30, Heads: 4})
	var pe *gguf.ParamError
	fmt.Println(errors.Is(err, gguf.ErrShape), errors.As(err, &pe) && pe.Field == "Heads")
	fmt.Println(err)
	// Output:
	// true true
	// gguf: Heads 4: inconsistent shape: does not divide Embedding 30
}

func ExampleDigest() {
	d, err := gguf.Digest(gguf.Small())
	if err != nil {
		panic(err)
	}
	fmt.Println(d)
	// Output: sha256:fe95b464b8d6d405f65e3a9ee440c20ac20ed1eeae6e20e0822eb3a822e6f9e2
}
