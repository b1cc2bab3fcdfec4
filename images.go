package vramguard

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ollama/ollama/api"
)

// MaxImageBytes is the largest image accepted, checked before a request
// is sent.
const MaxImageBytes = 20 << 20

// maxImagesBytes bounds the images of one request together (they travel
// base64-encoded, a third larger): 64 MiB, as ErrImageTooLarge says.
const maxImagesBytes = 64 << 20

var (
	// ErrImageFormat: an image is not PNG, JPEG or WebP, the formats
	// every Ollama version decodes (told by the image's first bytes).
	ErrImageFormat = errors.New("image is not PNG, JPEG or WebP")
	// ErrImageTooLarge: an image is over MaxImageBytes, or a request's
	// images together over 64 MiB.
	ErrImageTooLarge = errors.New("image too large")
	// ErrNoVision: the model cannot see images. The request fails with
	// KindInvalidInput, before anything is sent when the server lists the
	// model's capabilities (/api/show), otherwise from the server's own
	// refusal.
	ErrNoVision = errors.New("model cannot see images")
)

// ImageType returns the type of an image told by its first bytes: "png",
// "jpeg" or "webp", or "" for anything else.
func ImageType(img []byte) string {
	switch {
	case bytes.HasPrefix(img, []byte("\x89PNG\r\n\x1a\n")):
		return "png"
	case bytes.HasPrefix(img, []byte("\xff\xd8\xff")):
		return "jpeg"
	case len(img) >= 12 && bytes.Equal(img[:4], []byte("RIFF")) && bytes.Equal(img[8:12], []byte("WEBP")):
		return "webp"
	}
	return ""
}

// CheckImage reports whether the library sends img as an image: PNG,
// JPEG or WebP (told by its first bytes, see ImageType), at most
// MaxImageBytes. The error wraps ErrImageFormat (an empty image too) or
// ErrImageTooLarge, and names no operation: callers put it in theirs
// (requests refuse such an image with KindInvalidInput).
func CheckImage(img []byte) error {
	switch {
	case len(img) == 0:
		return fmt.Errorf("%w: the image is empty", ErrImageFormat)
	case len(img) > MaxImageBytes:
		return fmt.Errorf("%w: %d bytes, over %d", ErrImageTooLarge, len(img), MaxImageBytes)
	case ImageType(img) == "":
		return fmt.Errorf("%w (it starts %q)", ErrImageFormat, img[:min(len(img), 8)])
	}
	return nil
}

// validImage checks one image; total adds up the request's images.
func validImage(op, model, where string, img []byte, total *int) error {
	if err := CheckImage(img); err != nil {
		return newError(op, model, KindInvalidInput, fmt.Errorf("%s: %w", where, err))
	}
	*total += len(img)
	if *total > maxImagesBytes {
		return newError(op, model, KindInvalidInput, fmt.Errorf("%s: %w: the images add up to over %d bytes", where, ErrImageTooLarge, maxImagesBytes))
	}
	return nil
}

// validFormat accepts what Ollama accepts as a format: nothing, the
// string "json", or a JSON schema object.
func validFormat(op, model string, f json.RawMessage) error {
	t := bytes.TrimSpace(f)
	if len(t) == 0 || string(t) == "null" {
		return nil
	}
	var s string
	if json.Unmarshal(t, &s) == nil {
		if s == "json" {
			return nil
		}
		return invalid(op, model, "format %q: want \"json\" or a JSON schema object", s)
	}
	var schema map[string]any
	if err := json.Unmarshal(t, &schema); err != nil {
		return invalid(op, model, "format is neither \"json\" nor a JSON schema object: %v", err)
	}
	return nil
}

// normFormat is a valid format as it is sent: nil for none (blank or
// null), the JSON without surrounding white space otherwise.
func normFormat(f json.RawMessage) json.RawMessage {
	t := bytes.TrimSpace(f)
	if len(t) == 0 || string(t) == "null" {
		return nil
	}
	return t
}

// checkVision asks the server whether model can see images. It fails with
// ErrNoVision when the server lists the model's capabilities without
// "vision", and with the server's error when the model does not exist.
// A server that lists no capabilities, or fails otherwise, leaves the
// verdict to the request itself. The question counts against the call's
// first-chunk and total timeouts (t): each bounds it, with its own cause.
func (c *OllamaClient) checkVision(ctx context.Context, op, model string, t Timeouts) error {
	tctx, cancel := context.WithTimeoutCause(ctx, t.Total, ErrTotalTimeout)
	defer cancel()
	sctx, cancel := context.WithTimeoutCause(tctx, t.FirstChunk, ErrFirstChunkTimeout)
	defer cancel()
	resp, err := c.api.Show(sctx, &api.ShowRequest{Model: model})
	switch {
	case ctx.Err() != nil:
		return newError(op, model, KindCanceled, context.Cause(ctx))
	case sctx.Err() != nil:
		return newError(op, model, KindTimeout, fmt.Errorf("%w: asking the model's capabilities (/api/show)", context.Cause(sctx)))
	case err != nil && classify(err) == KindNotFound:
		return newError(op, model, KindNotFound, err)
	case err != nil:
		c.log.Debug("model capabilities unknown; the server will judge the images", "model", model, "err", err)
		return nil
	case len(resp.Capabilities) == 0:
		return nil
	}
	caps := make([]string, len(resp.Capabilities))
	for i, cp := range resp.Capabilities {
		caps[i] = string(cp)
	}
	if slices.Contains(caps, "vision") {
		return nil
	}
	return newError(op, model, KindInvalidInput, fmt.Errorf("%w: its capabilities are %s", ErrNoVision, strings.Join(caps, ", ")))
}
