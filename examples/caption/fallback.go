package main

// This file is the command's fallback when no Ollama answers: vramguard's
// test double (package vramguardtest), a fake Ollama server with one
// vision model. Like the rest of the command it uses only public
// packages, so you can copy it whole.

import (
	"bytes"
	"fmt"
	"image"
	_ "image/jpeg" // image.DecodeConfig reads JPEG sizes
	_ "image/png"  // and PNG sizes
	"regexp"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// simModel is the simulator's vision model.
const simModel = "llava:7b"

// styleRe finds the style a built-in style's instructions name.
var styleRe = regexp.MustCompile(`in the ([\w-]+) style`)

// simulated is a running simulator.
type simulated struct{ srv *vramguardtest.Server }

// startSimulator starts the simulator; close it when done.
func startSimulator() *simulated {
	srv := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{
		Name:         simModel,
		Vision:       true,
		SizeVRAM:     5_500_000_000,
		LoadLatency:  300 * time.Millisecond,
		TokenLatency: 3 * time.Millisecond,
		RespondTo:    simReply,
	}}})
	return &simulated{srv: srv}
}

// simReply is the simulated model's canned prompt: it names what it was
// sent (the image's type and size, the style), since it cannot see.
func simReply(c vramguardtest.Call) []vramguardtest.Chunk {
	what, style := "the image", "cinematic"
	for _, m := range c.Messages {
		if m.Role == "system" {
			if s := styleRe.FindStringSubmatch(m.Content); s != nil {
				style = s[1]
			}
		}
		for _, img := range m.Images {
			what = "the subject of a " + strings.ToUpper(vramguard.ImageType(img)) + " image"
			if cfg, _, err := image.DecodeConfig(bytes.NewReader(img)); err == nil {
				what = fmt.Sprintf("the subject of a %dx%d %s image", cfg.Width, cfg.Height, strings.ToUpper(vramguard.ImageType(img)))
			}
		}
	}
	text := what + ", " + style + " style, clear focal point, balanced composition, detailed textures, sharp focus, high resolution"
	var out []vramguardtest.Chunk
	for _, w := range strings.SplitAfter(text, " ") {
		out = append(out, vramguardtest.Chunk{Text: w})
	}
	return out
}

func (s *simulated) host() string { return s.srv.URL().String() }

func (s *simulated) close() { s.srv.Close() }
