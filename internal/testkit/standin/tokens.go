package standin

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
)

// The stand-in's vocabulary is the one internal/testkit/gguf writes: <unk>,
// <s>, </s>, then one token per byte. Tokenizing is therefore one token per
// byte, and detokenizing its exact inverse.
const (
	tokenUnk  = 0
	tokenBOS  = 1
	tokenEOS  = 2
	tokenByte = 3 // the token of byte b is tokenByte+b
	vocabSize = tokenByte + 256
)

var specialPieces = [...]string{tokenUnk: "<unk>", tokenBOS: "<s>", tokenEOS: "</s>"}

// tokenize returns one token per byte of s, after <s> when addSpecial.
func tokenize(s string, addSpecial bool) []int {
	out := make([]int, 0, len(s)+1)
	if addSpecial {
		out = append(out, tokenBOS)
	}
	for i := 0; i < len(s); i++ {
		out = append(out, tokenByte+int(s[i]))
	}
	return out
}

// piece is the text of one token; tokens outside the vocabulary have none.
func piece(id int) string {
	switch {
	case id >= 0 && id < tokenByte:
		return specialPieces[id]
	case id >= tokenByte && id < vocabSize:
		return string([]byte{byte(id - tokenByte)})
	}
	return ""
}

// detokenize is the inverse of tokenize; special tokens become their text,
// as llama-server's /detokenize renders them.
func detokenize(ids []int) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(piece(id))
	}
	return b.String()
}

// words is the output vocabulary: every generated token is " " + a word.
// Ollama aborts a generation after 100 identical tokens in a row; drawing
// from 64 words never gets near that.
var words = [64]string{
	"amber", "basalt", "cedar", "delta", "ember", "fjord", "granite", "harbor",
	"iris", "juniper", "kelp", "lagoon", "maple", "nectar", "onyx", "pebble",
	"quartz", "river", "saffron", "tundra", "umber", "valley", "willow", "xenon",
	"yarrow", "zephyr", "acorn", "breeze", "canyon", "dune", "estuary", "fern",
	"glacier", "heath", "inlet", "jasper", "knoll", "lichen", "meadow", "nimbus",
	"orchard", "prairie", "quill", "reef", "summit", "thicket", "upland", "vapor",
	"wharf", "yew", "alder", "bramble", "cobalt", "drift", "eddy", "flint",
	"grove", "hollow", "ivory", "jade", "kestrel", "loam", "moss", "nettle",
}

// sampler draws the generated words. The same prompt tokens and seed give
// the same words; Ollama's default seed -1 is an ordinary value here, so a
// default request is deterministic too.
type sampler struct{ state uint64 }

func newSampler(prompt []int, seed int64) *sampler {
	h := uint64(14695981039346656037) // FNV-1a
	mix := func(v uint64) {
		for i := 0; i < 8; i++ {
			h ^= v & 0xff
			h *= 1099511628211
			v >>= 8
		}
	}
	mix(uint64(seed))
	for _, t := range prompt {
		mix(uint64(t))
	}
	return &sampler{state: h}
}

// draw returns the next pseudo-random number (splitmix64).
func (s *sampler) draw() uint64 {
	s.state += 0x9e3779b97f4a7c15
	z := s.state
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// next returns the next token's text: a space and a word.
func (s *sampler) next() string {
	return " " + words[s.draw()%uint64(len(words))]
}

// promptTokens reads llama-server's "prompt" field: a string (tokenized
// with <s> first), an array of token ids and strings (pre-tokenized, as
// Ollama sends a prompt it truncated; strings in it are tokenized without
// <s>), an array of such prompts (the first is used), or an object
// {"prompt_string": ...}; one that also has "multimodal_data" is an error,
// as in a llama-server without a multimodal projector.
func promptTokens(raw json.RawMessage) ([]int, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New(`"prompt" must be provided`)
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return tokenize(s, true), nil
	}
	var mm struct {
		PromptString   *string         `json:"prompt_string"`
		MultimodalData json.RawMessage `json:"multimodal_data"`
	}
	if json.Unmarshal(raw, &mm) == nil && mm.PromptString != nil {
		if mm.MultimodalData != nil {
			return nil, errMultimodalPrompt
		}
		return tokenize(*mm.PromptString, true), nil
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, fmt.Errorf(`"prompt" must be a string, an array of tokens or an array of prompts`)
	}
	if len(items) > 0 {
		if first := strings.TrimSpace(string(items[0])); strings.HasPrefix(first, "[") || strings.HasPrefix(first, "{") {
			return promptTokens(items[0])
		}
	}
	var out []int
	for _, it := range items {
		var id int
		if json.Unmarshal(it, &id) == nil {
			out = append(out, id)
			continue
		}
		if json.Unmarshal(it, &s) == nil {
			out = append(out, tokenize(s, false)...)
			continue
		}
		return nil, fmt.Errorf(`"prompt" array elements must be token ids or strings`)
	}
	return out, nil
}

// chatMessage is the part of an OpenAI chat message the template uses.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// text returns a message's content: a string, or the text parts of an
// array of content parts (the chat handlers reject images and audio first,
// see mediaUnsupported).
func (m chatMessage) text() string {
	var s string
	if json.Unmarshal(m.Content, &s) == nil {
		return s
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if json.Unmarshal(m.Content, &parts) != nil {
		return ""
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// Without a multimodal projector (--mmproj, which Ollama never passes for
// the models of internal/testkit/gguf) llama-server refuses images and
// audio. These are its texts (oaicompat_chat_params_parse and
// tokenize_input_subprompt in llama.cpp's tools/server).
const (
	msgImageUnsupported = "image input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
	msgAudioUnsupported = "audio input is not supported - hint: if this is unexpected, you may need to provide the mmproj"
	msgMultimodalPrompt = "Multimodal data provided, but model does not support multimodal requests."
)

// errMultimodalPrompt is promptTokens' error for a prompt with
// "multimodal_data"; the handlers answer it with msgMultimodalPrompt.
var errMultimodalPrompt = errors.New("multimodal data without a multimodal projector")

// mediaUnsupported returns llama-server's answer to chat messages with an
// image or audio part: HTTP 500 (a runtime_error thrown while the request
// is parsed, not a 400), or nil when there is none.
func mediaUnsupported(msgs []chatMessage) *apiError {
	for _, m := range msgs {
		var parts []struct {
			Type string `json:"type"`
		}
		if json.Unmarshal(m.Content, &parts) != nil {
			continue
		}
		for _, p := range parts {
			switch p.Type {
			case "image_url":
				return &apiError{Code: http.StatusInternalServerError, Message: msgImageUnsupported, Type: "server_error"}
			case "input_audio":
				return &apiError{Code: http.StatusInternalServerError, Message: msgAudioUnsupported, Type: "server_error"}
			}
		}
	}
	return nil
}

// chatTemplate is the template the stand-in applies. It is ChatML, which
// llama-server falls back to for a model without tokenizer.chat_template,
// such as those of internal/testkit/gguf.
const chatTemplate = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"

// applyTemplate renders messages with ChatML.
func applyTemplate(msgs []chatMessage, addGenerationPrompt bool) string {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "<|im_start|>%s\n%s<|im_end|>\n", m.Role, m.text())
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}
