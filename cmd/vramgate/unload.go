package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
)

// unloadJSON is what an answer says of one verified unload.
type unloadJSON struct {
	Model     string `json:"model"`
	WasLoaded bool   `json:"was_loaded"`
	Verified  bool   `json:"verified"`
	// Checked names the checks Verified rests on ("ps+runner-processes",
	// "ps", ...); NoRunnerCheck says why the runner processes were not
	// checked; RunnerCheckBy who made the runner check when the gate did
	// not (its upstream is another vramgate).
	Checked       string   `json:"checked"`
	NoRunnerCheck string   `json:"no_runner_check,omitempty"`
	RunnerCheckBy string   `json:"runner_check_by,omitempty"`
	Attempts      int      `json:"attempts"`
	ElapsedMS     float64  `json:"elapsed_ms"`
	Leased        []string `json:"leased,omitempty"`
	Protected     bool     `json:"protected,omitempty"`
	HeldByOthers  bool     `json:"held_by_others,omitempty"`
	RunnerSeen    bool     `json:"runner_seen,omitempty"`
}

func unloadOf(r *vramguard.UnloadReport) unloadJSON {
	u := unloadJSON{Model: r.Model, WasLoaded: r.WasLoaded, Verified: r.Verified, Checked: r.Checked.String(),
		NoRunnerCheck: r.NoRunnerCheck, RunnerCheckBy: r.RunnerCheckBy, Attempts: r.Attempts, ElapsedMS: float64(r.Elapsed.Microseconds()) / 1000,
		Protected: r.Protected, HeldByOthers: r.HeldByOthers, RunnerSeen: r.RunnerSeen}
	for _, l := range r.Leased {
		u.Leased = append(u.Leased, l.String())
	}
	return u
}

// unloadSummary is one line for a header or trailer: what was verified,
// how, or why not.
func unloadSummary(r *vramguard.UnloadReport, err error) string {
	switch {
	case errors.Is(err, vramguard.ErrLeased):
		return "not unloaded by the gate: " + oneLine(err.Error())
	case err != nil:
		return "failed: " + oneLine(err.Error())
	case r == nil:
		return "not verified"
	case len(r.Leased) > 0:
		return "left: leased by " + oneLine(r.Leased[0].String())
	case !r.Verified:
		return "not verified"
	}
	s := fmt.Sprintf("verified; checked=%s; attempts=%d; elapsed=%s", r.Checked, r.Attempts, r.Elapsed.Round(time.Millisecond))
	if r.NoRunnerCheck != "" {
		s += "; no runner check: " + oneLine(r.NoRunnerCheck)
	}
	if r.RunnerCheckBy != "" {
		s += "; runner check by " + oneLine(r.RunnerCheckBy)
	}
	return s
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// verifiedUnload unloads model through the library, verified, and
// remembers it for the next load's cause and the metrics.
func (g *gate) verifiedUnload(ctx context.Context, model, client, why string) (*vramguard.UnloadReport, error) {
	// A lease an HTTP client took through the gate keeps the gate's own
	// client too (it is held for the client: ReserveOptions.Model), so
	// UnloadModel refuses it, naming the client, as another program's. A
	// load through the gate not answered yet is the library's to cut
	// (OllamaClient.Admit): an unload sent during a load is lost.
	//
	// UnloadReport.WasLoaded is false when the model went before the
	// library's first look; the gate's own look tells an eviction from an
	// unload of a model already gone.
	before, _ := g.resident(ctx)
	wasListed := slices.Contains(before, vramguard.NormalizeModelName(model))
	rep, err := g.client.UnloadModel(ctx, model)
	outcome := "verified"
	switch {
	case errors.Is(err, vramguard.ErrLeased):
		outcome = "leased"
	case err != nil:
		outcome = "failed"
	case !rep.Verified:
		outcome = "unverified"
	case !rep.WasLoaded && !wasListed:
		outcome = "already gone"
	}
	g.metrics.unloads.WithLabelValues(g.metrics.label(orUnnamed(client)), vramguard.NormalizeModelName(model), outcome).Inc()
	if err == nil && rep.Verified {
		g.noteGone(model, client, why)
	}
	g.log.Debug("unload", "model", model, "client", client, "why", why, "outcome", outcome, "err", err)
	return rep, err
}

func (g *gate) noteGone(model, client, why string) {
	name := vramguard.NormalizeModelName(model)
	g.mu.Lock()
	g.gone[name] = goneRecord{at: time.Now(), client: client, why: why}
	delete(g.loaded, name)
	g.mu.Unlock()
}

// unloadStatus is the HTTP status of a failed unload.
func unloadStatus(err error) int {
	switch {
	case errors.Is(err, vramguard.ErrLeased):
		return http.StatusConflict
	case vramguard.KindOf(err) == vramguard.KindNotFound:
		return http.StatusNotFound
	case vramguard.KindOf(err) == vramguard.KindInvalidInput:
		return http.StatusBadRequest
	case vramguard.KindOf(err) == vramguard.KindTimeout:
		return http.StatusGatewayTimeout
	}
	return http.StatusBadGateway
}

// unloadError answers a failed unload: Ollama's {"error": ...}, with the
// leases that kept the model when a lease did.
func unloadError(w http.ResponseWriter, model string, err error) {
	body := map[string]any{"error": "vramgate: unload " + model + ": " + oneLine(err.Error())}
	var le *vramguard.LeasedError
	if errors.As(err, &le) {
		var ls []string
		for _, l := range le.Leases {
			ls = append(ls, l.String())
		}
		body["leased_by"] = ls
	}
	writeJSON(w, unloadStatus(err), body)
}

// unloadReply answers an unload request (what `ollama stop` sends) only
// once the model is verified gone, in Ollama's own reply shape with a
// "vramgate" object and an X-Vramgate-Unload header that say what was
// verified.
func (g *gate) unloadReply(w http.ResponseWriter, r *http.Request, q *request, chat bool, client string) {
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.unloadWait)
	defer cancel()
	rep, err := g.verifiedUnload(ctx, q.Model, client, "unload request")
	if err != nil {
		unloadError(w, q.Model, err)
		return
	}
	reply := map[string]any{
		"model":       q.Model,
		"created_at":  time.Now().UTC(),
		"done":        true,
		"done_reason": "unload",
		"vramgate":    unloadOf(rep),
	}
	if chat {
		reply["message"] = map[string]string{"role": "assistant", "content": ""}
	} else {
		reply["response"] = ""
	}
	w.Header().Set(unloadTrailer, unloadSummary(rep, nil))
	ct := "application/json; charset=utf-8"
	if q.streams() {
		ct = "application/x-ndjson"
	}
	w.Header().Set("Content-Type", ct)
	w.WriteHeader(http.StatusOK)
	_ = json.NewEncoder(w).Encode(reply)
}

// unloadRoute answers POST /api/unload {"model": M} or {"all": true}:
// each model verified gone (or, for all, left because a lease or
// -protected keeps it, said so), 200 with the reports; a failure's status
// says which (409 leased, 404 not found, 504 timed out).
func (g *gate) unloadRoute(w http.ResponseWriter, r *http.Request) {
	body, ok := g.readBody(w, r)
	if !ok {
		return
	}
	var q struct {
		Model string `json:"model"`
		All   bool   `json:"all"`
	}
	if err := json.Unmarshal(body, &q); err != nil {
		writeError(w, http.StatusBadRequest, "malformed JSON body: %v (want {\"model\": NAME} or {\"all\": true})", err)
		return
	}
	if (q.Model == "") == !q.All {
		writeError(w, http.StatusBadRequest, "want {\"model\": NAME} or {\"all\": true}, one of them")
		return
	}
	client := clientOf(r)
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.unloadWait)
	defer cancel()
	if q.Model != "" {
		rep, err := g.verifiedUnload(ctx, q.Model, client, "POST /api/unload")
		if err != nil {
			unloadError(w, q.Model, err)
			return
		}
		w.Header().Set(unloadTrailer, unloadSummary(rep, nil))
		writeJSON(w, http.StatusOK, map[string]any{"unloaded": []unloadJSON{unloadOf(rep)}, "verified": rep.Verified})
		return
	}
	// One by one through verifiedUnload, not UnloadAll: the gate's own
	// client is not kept by its own leases, and the HTTP clients' leases it
	// holds must keep their models here too.
	models, err := g.resident(ctx)
	if err != nil {
		writeError(w, http.StatusBadGateway, "Ollama's /api/ps: %v", err)
		return
	}
	out := make([]unloadJSON, 0, len(models))
	left := []string{}
	var errs []error
	verified := true
	for _, m := range models {
		rep, err := g.verifiedUnload(ctx, m, client, "POST /api/unload all")
		var le *vramguard.LeasedError
		switch {
		case errors.As(err, &le):
			u := unloadJSON{Model: m, WasLoaded: true, Checked: vramguard.Checks(0).String()}
			for _, l := range le.Leases {
				u.Leased = append(u.Leased, l.String())
			}
			out = append(out, u)
			left = append(left, m)
		case err != nil:
			errs = append(errs, err)
			verified = false
		default:
			out = append(out, unloadOf(rep))
			verified = verified && rep.Verified
		}
	}
	err = errors.Join(errs...)
	// verified: every listed model is verified gone; left names those a
	// lease kept resident (no failure: 200).
	ans := map[string]any{"unloaded": out, "left": left, "verified": verified && err == nil && len(left) == 0}
	code := http.StatusOK
	if err != nil {
		code = unloadStatus(err)
		ans["error"] = "vramgate: unload all: " + oneLine(err.Error())
	}
	w.Header().Set(unloadTrailer, fmt.Sprintf("all: %d listed, %d left (leased)", len(models), len(left)))
	writeJSON(w, code, ans)
}
