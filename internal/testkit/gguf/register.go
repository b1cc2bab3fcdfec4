package gguf

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"

	"github.com/ollama/ollama/api"
)

// Digest returns the blob digest of the file Write produces for p, in the
// form Ollama uses: "sha256:<64 hex digits>".
func Digest(p Params) (string, error) {
	h := sha256.New()
	if err := Write(h, p); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// Register uploads the model described by p to the Ollama server behind c
// and creates the model name from it, replacing any model of that name. It
// returns the blob digest ("sha256:<hex>").
//
// The file is generated twice (once to hash it, once streamed into the
// upload) rather than held in memory. Register works against Ollama v0.6.5
// and later, which accept CreateRequest.Files.
//
// ctx bounds the whole call. Because the Ollama client returns nil when a
// stream ends early, Register only reports success after the server sent
// its final "success" status.
func Register(ctx context.Context, c *api.Client, name string, p Params) (string, error) {
	if c == nil {
		return "", errors.New("gguf: register: nil client")
	}
	if name == "" {
		return "", errors.New("gguf: register: empty model name")
	}
	digest, err := Digest(p)
	if err != nil {
		return "", err
	}

	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// A write error reaches CreateBlob as a failed body read.
		pw.CloseWithError(Write(pw, p))
	}()
	err = c.CreateBlob(ctx, digest, pr)
	// Unblock the writer if the server answered without reading everything
	// (it skips the body when it already has the blob).
	pr.Close()
	<-done
	if err != nil {
		return "", fmt.Errorf("gguf: register %q: upload blob: %w", name, err)
	}

	var success bool
	req := &api.CreateRequest{
		Model: name,
		Files: map[string]string{"model.gguf": digest},
	}
	err = c.Create(ctx, req, func(r api.ProgressResponse) error {
		if r.Status == "success" {
			success = true
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("gguf: register %q: create: %w", name, err)
	}
	if !success {
		cause := context.Cause(ctx)
		if cause == nil {
			cause = io.ErrUnexpectedEOF
		}
		return "", fmt.Errorf("gguf: register %q: create ended without success: %w", name, cause)
	}
	return digest, nil
}
