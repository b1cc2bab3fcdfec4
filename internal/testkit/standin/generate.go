package standin

import (
	"context"
	"net/http"
	"strings"
	"time"
)

// plan is what one completion will generate at most, decided before the
// first token.
type plan struct {
	prompt   []int
	limit    int    // tokens to generate unless a stop word comes first
	stopType string // why the generation ends after limit tokens
	stops    []string
	seed     int64
	pieces   []string // the tokens of a structured answer; nil: free text
}

// exceedContext is llama-server's answer to a prompt that does not fit in a
// slot's context.
func exceedContext(nPrompt, nCtx int) apiError {
	return apiError{
		Code:          http.StatusBadRequest,
		Message:       "the request exceeds the available context size, try increasing it",
		Type:          "exceed_context_size_error",
		NPromptTokens: nPrompt,
		NCtx:          nCtx,
	}
}

// plan applies n_predict, the model's own end of sequence (EOSAfter) and
// the slot's context. A structured answer (pieces, see schemaPieces) ends
// with "eos" after its last piece, whatever EOSAfter says, as a grammar
// allows the end of sequence only there; n_predict may cut it short. A
// prompt that fills the context is rejected, as llama-server does;
// otherwise, without --context-shift, the generation stops with "limit"
// when the context is full.
func (r *runner) plan(k Knobs, prompt []int, nPredict int, seed int64, stops, pieces []string) (plan, *apiError) {
	nctx := r.opts.slotCtx()
	if len(prompt) >= nctx {
		e := exceedContext(len(prompt), nctx)
		return plan{}, &e
	}
	p := plan{prompt: prompt, seed: seed, stops: stops, pieces: pieces}
	switch eos := k.eosAfter(); {
	case pieces != nil && nPredict > 0 && nPredict < len(pieces):
		p.limit, p.stopType = nPredict, "limit"
	case pieces != nil:
		p.limit, p.stopType = len(pieces), "eos"
	case nPredict > 0 && nPredict <= eos:
		p.limit, p.stopType = nPredict, "limit"
	default:
		p.limit, p.stopType = eos, "eos"
	}
	if room := nctx - len(prompt); !r.opts.contextShift && room < p.limit {
		p.limit, p.stopType = room, "limit"
	}
	return p, nil
}

// generation is the outcome of one completion.
type generation struct {
	text         string
	n            int
	stopType     string // "limit", "eos" or "word"
	stoppingWord string
	prompt       time.Duration
	predicted    time.Duration
}

// finishReason is the OpenAI name of stopType.
func (g generation) finishReason() string {
	if g.stopType == "limit" {
		return "length"
	}
	return "stop"
}

type timings struct {
	CacheN              int     `json:"cache_n"`
	PromptN             int     `json:"prompt_n"`
	PromptMS            float64 `json:"prompt_ms"`
	PromptPerTokenMS    float64 `json:"prompt_per_token_ms"`
	PromptPerSecond     float64 `json:"prompt_per_second"`
	PredictedN          int     `json:"predicted_n"`
	PredictedMS         float64 `json:"predicted_ms"`
	PredictedPerTokenMS float64 `json:"predicted_per_token_ms"`
	PredictedPerSecond  float64 `json:"predicted_per_second"`
}

func (g generation) timings(promptN int) timings {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	t := timings{
		PromptN:     promptN,
		PromptMS:    ms(g.prompt),
		PredictedN:  g.n,
		PredictedMS: ms(g.predicted),
	}
	if promptN > 0 {
		t.PromptPerTokenMS = t.PromptMS / float64(promptN)
	}
	if t.PromptMS > 0 {
		t.PromptPerSecond = 1000 * float64(promptN) / t.PromptMS
	}
	if g.n > 0 {
		t.PredictedPerTokenMS = t.PredictedMS / float64(g.n)
	}
	if t.PredictedMS > 0 {
		t.PredictedPerSecond = 1000 * float64(g.n) / t.PredictedMS
	}
	return t
}

// generate produces the tokens of p, waiting TokenMS before each, and
// passes each to emit. It returns an error, having emitted only part of
// the text, when ctx ends, the process shuts down or emit fails (the
// client went away). With CrashAfterTokens it does not return: the crash
// aborts the handler once that many tokens were emitted.
func (r *runner) generate(ctx context.Context, k Knobs, p plan, emit func(piece string) error) (g generation, err error) {
	task := r.tasks.Add(1)
	crashed := false
	defer func() {
		if crashed {
			return // an aborted process prints nothing more
		}
		if err != nil {
			r.log.linef("srv  cancel_tasks: cancel task, id_task = %d", task)
		}
		r.log.linef("slot      release: id  0 | task %d | stop processing: n_past = %d, n_decoded = %d, truncated = 0", task, len(p.prompt)+g.n, g.n)
	}()
	start := time.Now()
	s := newSampler(p.prompt, p.seed)
	g = generation{stopType: p.stopType, prompt: time.Since(start)}
	var text strings.Builder
	for g.n < p.limit {
		if err := r.waitDelay(ctx, k.tokenDelay()); err != nil {
			return g, err
		}
		var tok string
		if p.pieces != nil {
			tok = p.pieces[g.n]
		} else {
			tok = s.next()
		}
		emitted := text.Len()
		text.WriteString(tok)
		g.n++
		if i, word := firstStop(text.String(), p.stops); i >= 0 {
			if i > emitted {
				if err := emit(text.String()[emitted:i]); err != nil {
					return g, err
				}
			}
			g.text, g.stopType, g.stoppingWord = text.String()[:i], "word", word
			g.predicted = time.Since(start) - g.prompt
			return g, nil
		}
		if err := emit(tok); err != nil {
			return g, err
		}
		if k.CrashAfterTokens > 0 && g.n == k.CrashAfterTokens {
			crashed = true
			r.crash(g.n)
		}
	}
	g.text = text.String()
	g.predicted = time.Since(start) - g.prompt
	return g, nil
}

// firstStop returns where the earliest stop word begins in text, or -1.
func firstStop(text string, stops []string) (int, string) {
	at, word := -1, ""
	for _, s := range stops {
		if s == "" {
			continue
		}
		if i := strings.Index(text, s); i >= 0 && (at < 0 || i < at) {
			at, word = i, s
		}
	}
	return at, word
}
