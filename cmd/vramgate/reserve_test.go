package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// reservedAnswer is POST /vramgate/reservations' answer.
type reservedAnswer struct {
	Reservation reservationAnswer `json:"reservation"`
	Receipt     *receipt          `json:"receipt"`
}

// refusalOf decodes a 503's body.
func refusalOf(t *testing.T, body []byte) refusal {
	t.Helper()
	var ref refusal
	if err := json.Unmarshal(body, &ref); err != nil {
		t.Fatalf("refusal body %s: %v", body, err)
	}
	return ref
}

// namesReservation reports whether ref names a reservation for forWhom
// as a blocker, with an end.
func namesReservation(ref refusal, forWhom string) bool {
	for _, b := range ref.Blockers {
		if b.Kind == "reservation" && strings.Contains(b.Holder, "for "+forWhom) && b.Until != nil && b.Bytes > 0 {
			return true
		}
	}
	return false
}

// The seed, with the exclusive hand-off: an orchestrator's phase hands
// 22 GiB over to a render, reserved; a chat UI's load through the gate is
// refused while the reservation stands (503, Retry-After, the reservation
// named as a blocker), and so is /vramgate/can-load; the render allocates
// with no out-of-memory; after the release the chat load is served.
func TestHandOverReservedAgainstTheGate(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 24 * gib})
	g := startGate(t, sim.URL().String(), sim.GPU())
	orch, err := vramguard.NewClient(vramguard.Options{Host: sim.URL().String(), VRAM: sim.GPU(), Leases: vramguard.LeaseOptions{Dir: g.LeaseDir}})
	if err != nil {
		t.Fatal(err)
	}
	defer orch.Close()
	p, err := orch.StartPhase(t.Context(), "prompts", vramguard.PhaseOptions{NeedBytes: 22 * gib, Reserve: vramguard.ReserveOptions{For: "render 42"}})
	if err != nil {
		t.Fatal(err)
	}
	pg := p.Guard()
	if _, err := pg.Generate(t.Context(), &vramguard.GenerateRequest{Model: "small", Prompt: "x"}, nil); err != nil {
		t.Fatal(err)
	}
	rep, err := p.End(t.Context())
	if err != nil || rep.Handover.Reservation == nil {
		t.Fatalf("hand-over: %+v, %v; want reserved", rep, err)
	}
	for _, route := range []struct{ method, path, body string }{
		{"POST", "/api/generate", `{"model":"small","prompt":"hi","stream":false}`},
		{"GET", "/vramgate/can-load?model=small", ""},
	} {
		code, hdr, body := do(t, route.method, g.URL+route.path, route.body, clientHeader, "chat-ui")
		ref := refusalOf(t, body)
		if code != 503 || hdr.Get("Retry-After") == "" || ref.Reason != "reserved" || !namesReservation(ref, "render 42") ||
			!strings.Contains(ref.Error, "render 42") || !strings.Contains(strings.Join(ref.Checked, ","), "reservations") {
			t.Fatalf("%s %s during the reservation: %d %s", route.method, route.path, code, body)
		}
	}
	if sim.Loads("small") != 1 {
		t.Fatalf("small loaded %d times; want the phase's one (a refused load reached the server)", sim.Loads("small"))
	}
	if err := sim.Reserve("render", 22*gib); err != nil {
		t.Fatalf("the render could not allocate its room: %v", err)
	}
	sim.Release("render")
	if err := rep.Handover.Reservation.Release(); err != nil {
		t.Fatal(err)
	}
	if code, _, body := do(t, "POST", g.URL+"/api/generate", `{"model":"small","prompt":"hi","stream":false}`, clientHeader, "chat-ui"); code != 200 {
		t.Fatalf("chat after the release: %d %s", code, body)
	}
}

// HTTP reservations: taken for a recipient by a program that does not
// import vramguard, honoured by the gate's own admissions and by every
// other vramguard client (which sees the HTTP client's name), listed
// without their ids, extended and released by id alone.
func TestHTTPReservations(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 24 * gib})
	g := startGate(t, sim.URL().String(), sim.GPU(), "-lease-max", "2m")
	other, err := vramguard.NewClient(vramguard.Options{Host: sim.URL().String(), VRAM: sim.GPU(), Leases: vramguard.LeaseOptions{Dir: g.LeaseDir}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	code, _, body := do(t, "POST", g.URL+"/vramgate/reservations", `{"device":0,"bytes":23622320128,"for":"comfy render","holder":"my-node","ttl":"1m"}`)
	var a reservedAnswer
	if err := json.Unmarshal(body, &a); err != nil || code != 201 || len(a.Reservation.ID) != 32 || a.Reservation.Bytes != 22*gib ||
		a.Reservation.For != "comfy render" || a.Reservation.Holder != "my-node" || a.Receipt != nil {
		t.Fatalf("take: %d %s", code, body)
	}
	id := a.Reservation.ID
	code, _, body = do(t, "POST", g.URL+"/api/generate", `{"model":"small","prompt":"hi"}`)
	if ref := refusalOf(t, body); code != 503 || !namesReservation(ref, "comfy render") {
		t.Fatalf("the gate's own admission beside its HTTP reservation: %d %s", code, body)
	}
	_, err = other.EnsureFree(t.Context(), vramguard.EnsureRequest{Bytes: 8 * gib, DryRun: true})
	var re *vramguard.RoomError
	if !errors.As(err, &re) || len(re.Reserved) != 1 || re.Reserved[0].For != "comfy render" || !strings.Contains(re.Reserved[0].Note, "my-node") {
		t.Fatalf("another vramguard program: %v; want refused naming the HTTP client's reservation", err)
	}
	code, _, body = do(t, "GET", g.URL+"/vramgate/reservations", "")
	if code != 200 || !strings.Contains(string(body), "comfy render") || strings.Contains(string(body), id) {
		t.Fatalf("list: %d %s", code, body)
	}
	// Another program's reservation is listed too, as the host's.
	if _, err := other.Reserve(t.Context(), 0, gib, vramguard.ReserveOptions{For: "encoder"}); err != nil {
		t.Fatal(err)
	}
	if code, _, body = do(t, "GET", g.URL+"/vramgate/reservations", ""); code != 200 || !strings.Contains(string(body), `"for":"encoder"`) || !strings.Contains(string(body), `"through":"host"`) {
		t.Fatalf("list with another program's reservation: %d %s", code, body)
	}
	code, _, body = do(t, "POST", g.URL+"/vramgate/reservations/"+id, `{"ttl":"90s"}`)
	if err := json.Unmarshal(body, &a); err != nil || code != 200 || time.Until(a.Reservation.Until) < 80*time.Second {
		t.Fatalf("extend: %d %s", code, body)
	}
	for _, bad := range []string{"0123456789abcdef0123456789abcdef", "x"} {
		if code, _, _ := do(t, "DELETE", g.URL+"/vramgate/reservations/"+bad, ""); code != 404 {
			t.Errorf("DELETE %s: %d, want 404", bad, code)
		}
	}
	if code, _, body := do(t, "DELETE", g.URL+"/vramgate/reservations/"+id, ""); code != 200 {
		t.Fatalf("release: %d %s", code, body)
	}
	if code, _, _ := do(t, "DELETE", g.URL+"/vramgate/reservations/"+id, ""); code != 404 {
		t.Fatalf("second release: %d, want 404", code)
	}
	if code, _, body := do(t, "POST", g.URL+"/api/generate", `{"model":"small","prompt":"hi","stream":false}`); code != 200 {
		t.Fatalf("load after the release: %d %s", code, body)
	}
}

// The seed plan as one call: make 20 GiB free (the idle models another
// program left are unloaded, verified) and reserve it, answered with a
// measured receipt; when leases keep what the room needs, a 503 names
// it with Retry-After, and nothing is unloaded or reserved.
func TestMakeRoomThenReserve(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 24 * gib})
	g := startGate(t, sim.URL().String(), sim.GPU())
	load(t, sim.APIClient(), "tiny")
	load(t, sim.APIClient(), "small")
	code, _, body := do(t, "POST", g.URL+"/vramgate/reservations", `{"device":0,"bytes":21474836480,"for":"render","holder":"comfy-node","make_room":true}`)
	var a reservedAnswer
	if err := json.Unmarshal(body, &a); err != nil || code != 201 || a.Receipt == nil || len(a.Receipt.Evicted) == 0 ||
		a.Receipt.FreeAfter < 20*gib || a.Receipt.FreeBefore >= 20*gib || a.Receipt.Source != vramguardtest.GPUSource {
		t.Fatalf("make room then reserve: %d %s", code, body)
	}
	_, _, free := sim.Memory()
	if free < 20*gib {
		t.Fatalf("%d bytes free after the receipt said %d", free, a.Receipt.FreeAfter)
	}
	if code, _, body := do(t, "DELETE", g.URL+"/vramgate/reservations/"+a.Reservation.ID, ""); code != 200 {
		t.Fatalf("release: %d %s", code, body)
	}
	// Leases keep both: the room cannot be made.
	load(t, sim.APIClient(), "tiny")
	load(t, sim.APIClient(), "small")
	for _, m := range []string{"tiny", "small"} {
		code, _, body = do(t, "POST", g.URL+"/vramgate/leases", `{"model":"`+m+`","holder":"chat-ui","ttl":"1m"}`)
		if code != 201 {
			t.Fatalf("lease: %d %s", code, body)
		}
	}
	code, hdr, body := do(t, "POST", g.URL+"/vramgate/reservations", `{"device":0,"bytes":21474836480,"for":"render","holder":"comfy-node","make_room":true}`)
	ref := refusalOf(t, body)
	if code != 503 || hdr.Get("Retry-After") == "" || !ref.RetryAfterKnown || !strings.Contains(string(body), "chat-ui") {
		t.Fatalf("make room past a lease: %d %s", code, body)
	}
	if !sim.Listed("tiny") || !sim.Listed("small") {
		t.Fatal("a refused make-room unloaded a model")
	}
	if code, _, body := do(t, "GET", g.URL+"/vramgate/reservations", ""); code != 200 || strings.Contains(string(body), `"for":"render"`) {
		t.Fatalf("a refused make-room left a reservation: %s", body)
	}
}

// Bad input: each a clear 400 (or 503 without a reader), nothing reserved;
// a web page's cross-origin POST is refused 403 as Ollama refuses it.
func TestReservationsRefuse(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 24 * gib})
	g := startGate(t, sim.URL().String(), sim.GPU(), "-lease-max", "2m")
	for _, tc := range []struct {
		body string
		code int
		text string
	}{
		{`{"bytes":1024,"for":"r","holder":"h"}`, 400, "needs a device"},
		{`{"device":0,"for":"r","holder":"h"}`, 400, "bytes above 0"},
		{`{"device":0,"bytes":1024,"holder":"h"}`, 400, `needs \"for\"`},
		{`{"device":0,"bytes":1024,"for":"r"}`, 400, "holder"},
		{`{"device":0,"bytes":1024,"for":"r","holder":"h","ttl":1e12}`, 400, "ttl 1e12"},
		{`{"device":0,"bytes":1024,"for":"r","holder":"h","ttl":"-5s"}`, 400, "ttl"},
		{`{"device":-1,"bytes":1024,"for":"r","holder":"h"}`, 400, "device -1"},
		{`{"device":0,"bytes":30000000000000,"for":"r","holder":"h"}`, 400, "in total"},
		{`{"device":3,"bytes":1024,"for":"r","holder":"h"}`, 400, "no device 3"},
		{`{"device":0,"bytes":1024,"for":"a\u0000b","holder":"h"}`, 400, "not printable"},
		{`{"device":0,`, 400, "malformed JSON"},
	} {
		code, _, body := do(t, "POST", g.URL+"/vramgate/reservations", tc.body)
		if code != tc.code || !strings.Contains(string(body), tc.text) {
			t.Errorf("take %s: %d %s; want %d naming %q", tc.body, code, body, tc.code, tc.text)
		}
	}
	code, _, body := do(t, "POST", g.URL+"/vramgate/reservations", `{"device":0,"bytes":1024,"for":"r","holder":"h"}`,
		"Origin", "http://evil.example", "Content-Type", "text/plain")
	if code != 403 {
		t.Errorf("cross-origin take: %d %s, want 403", code, body)
	}
	if code, _, body := do(t, "GET", g.URL+"/vramgate/reservations", ""); code != 200 || !strings.Contains(string(body), `"reservations":[]`) {
		t.Fatalf("after the refusals: %d %s; want none reserved", code, body)
	}
	noReader := startGate(t, sim.URL().String(), nil)
	code, _, body = do(t, "POST", noReader.URL+"/vramgate/reservations", `{"device":0,"bytes":1024,"for":"r","holder":"h"}`)
	if code != 503 || !strings.Contains(string(body), "no GPU reader") {
		t.Errorf("without a GPU reader: %d %s", code, body)
	}
	code, _, body = do(t, "GET", noReader.URL+"/vramgate/can-load?model=tiny", "")
	if code != 200 || !strings.Contains(string(body), "reservations (no GPU reader") {
		t.Errorf("can-load without a GPU reader: %d %s; want reservations named as not checked", code, body)
	}
}

// The gate's -max-loaded eviction follows the library's one victim policy
// (EnsureRequest.AllModels' plan order: the fewest bytes to load again
// first): two runs that change nothing but which resident model is the
// cheaper to reload see the gate evict that one, whatever order Ollama
// lists them in.
func TestSlotVictimFollowsTheLibrarysPolicy(t *testing.T) {
	for _, tc := range []struct {
		xSize, ySize uint64
		victim       string
	}{
		{2 * gib, 3 * gib, "x"},
		{3 * gib, 2 * gib, "y"},
	} {
		t.Run("victim "+tc.victim, func(t *testing.T) {
			sim := newSim(t, vramguardtest.Config{Models: []vramguardtest.ModelConfig{
				{Name: "x", Size: tc.xSize, Chunks: 1}, {Name: "y", Size: tc.ySize, Chunks: 1}, {Name: "z", Size: gib, Chunks: 1},
			}})
			g := startGate(t, sim.URL().String(), nil, "-max-loaded", "2")
			c := apiClient(t, g.URL)
			load(t, c, "x")
			load(t, c, "y")
			code, hdr, body := do(t, "POST", g.URL+"/api/generate", `{"model":"z","prompt":"hi","stream":false}`)
			if code != 200 || !strings.Contains(hdr.Get("X-Vramgate-Admission"), "unloaded to make room: "+tc.victim+":latest") {
				t.Fatalf("third load: %d %s, admission %q; want %s evicted", code, body, hdr.Get("X-Vramgate-Admission"), tc.victim)
			}
			if sim.Listed(tc.victim) {
				t.Fatalf("%s still listed", tc.victim)
			}
		})
	}
}

// make_room keeps a model that a request through the gate is using: the
// room is made from idle models (the smaller in-use one would have been
// the library's pick), and a room that only the in-use model could make
// is refused, naming it, with nothing unloaded. The request is never
// disturbed: its stream, stalled by the fault for the whole make_room,
// ends done. No hold is left behind.
func TestMakeRoomKeepsModelsInUseThroughTheGate(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 8 * gib})
	g := startGate(t, sim.URL().String(), sim.GPU())
	load(t, sim.APIClient(), "tiny")  // 2 GiB
	load(t, sim.APIClient(), "small") // 3 GiB: 3 GiB free
	if err := sim.FailNext("tiny", vramguardtest.StallAfter(1, 4*time.Second)); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(post(t, g.URL+"/api/generate", `{"model":"tiny","prompt":"hi"}`).Body)
	if !lines.Scan() {
		t.Fatalf("no first chunk: %v", lines.Err())
	}
	streamDone := make(chan bool, 1)
	go func() {
		done := false
		for lines.Scan() {
			done = done || strings.Contains(lines.Text(), `"done":true`)
		}
		streamDone <- done
	}()

	// 5 GiB: tiny alone (the smallest that is enough) or small alone.
	code, _, body := do(t, "POST", g.URL+"/vramgate/reservations", `{"device":0,"bytes":5368709120,"for":"render","holder":"comfy-node","make_room":true}`)
	var a reservedAnswer
	if err := json.Unmarshal(body, &a); err != nil || code != 201 || a.Receipt == nil || !slices.Equal(a.Receipt.Evicted, []string{"small:latest"}) {
		t.Fatalf("make_room beside a request on tiny: %d %s; want small evicted, tiny kept", code, body)
	}
	select {
	case <-streamDone:
		t.Fatal("the stream ended before make_room returned: the test's stall did not cover it")
	default:
	}
	if !sim.Listed("tiny") || sim.Listed("small") {
		t.Fatalf("tiny listed %v, small listed %v", sim.Listed("tiny"), sim.Listed("small"))
	}
	if code, _, body := do(t, "DELETE", g.URL+"/vramgate/reservations/"+a.Reservation.ID, ""); code != 200 {
		t.Fatalf("release: %d %s", code, body)
	}

	// 7 GiB: only tiny's 2 GiB beside the 6 free could make it.
	// The refusal names tiny in use, with no known end (the request's),
	// not as a lease ending at the hold's TTL.
	code, hdr, body := do(t, "POST", g.URL+"/vramgate/reservations", `{"device":0,"bytes":7516192768,"for":"render","holder":"comfy-node","make_room":true}`)
	ref := refusalOf(t, body)
	inUse := slices.ContainsFunc(ref.Blockers, func(b blocker) bool { return b.Kind == "in use" && strings.HasPrefix(b.Model, "tiny") })
	if code != 503 || hdr.Get("Retry-After") == "" || !inUse || ref.RetryAfterKnown || ref.Reason != "no room" || ref.RetryAfter > 60 {
		t.Fatalf("make_room that needs the model in use: %d %s; want 503 naming tiny in use, retry not known", code, body)
	}
	if !sim.Listed("tiny") {
		t.Fatal("a refused make_room unloaded the model in use")
	}
	if done := <-streamDone; !done {
		t.Fatal("the request through the gate did not end done")
	}
	if left, _ := filepath.Glob(filepath.Join(g.LeaseDir, "*.lease")); len(left) != 0 {
		t.Fatalf("holds left after make_room: %v", left)
	}
}

// A reservation taken through the gate for a recipient process ("pid")
// lists what that process has allocated of it (taken_bytes), as the
// listing's reading measured it; before, the gate's own listed none.
func TestGateListsWhatItsRecipientTook(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 24 * gib})
	g := startGate(t, sim.URL().String(), sim.GPU())
	if err := sim.Reserve("render", 1<<20); err != nil { // the render's process, before it loads
		t.Fatal(err)
	}
	code, _, body := do(t, "POST", g.URL+"/vramgate/reservations", fmt.Sprintf(`{"device":0,"bytes":%d,"for":"render","holder":"comfy-node","pid":%d}`, 10*gib, sim.HeldPID("render")))
	if code != 201 {
		t.Fatalf("take: %d %s", code, body)
	}
	if err := sim.Reserve("render", 4*gib); err != nil {
		t.Fatal(err)
	}
	code, _, body = do(t, "GET", g.URL+"/vramgate/reservations", "")
	var l struct {
		Reservations []reservationAnswer `json:"reservations"`
	}
	if err := json.Unmarshal(body, &l); err != nil || code != 200 || len(l.Reservations) != 1 ||
		l.Reservations[0].Through != "vramgate" || l.Reservations[0].Taken != 4*gib {
		t.Fatalf("list: %d %s; want the gate's reservation with 4 GiB taken", code, body)
	}
}

// Two HTTP clients' takes that do not fit together: the second is the
// gate's 503 ("reserved", Retry-After, the first named as a blocker),
// nothing reserved for it. A reservation whose TTL ended is gone from the
// list and its id extends nothing (404); one that stands when the gate
// stops ends with it: no reservation file is left.
func TestHTTPReservationsConflictEndAndStop(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 24 * gib})
	g := startGate(t, sim.URL().String(), sim.GPU())
	code, _, body := do(t, "POST", g.URL+"/vramgate/reservations", fmt.Sprintf(`{"device":0,"bytes":%d,"for":"render a","holder":"node-a","ttl":"1m"}`, 16*gib))
	if code != 201 {
		t.Fatalf("first take: %d %s", code, body)
	}
	code, hdr, body := do(t, "POST", g.URL+"/vramgate/reservations", fmt.Sprintf(`{"device":0,"bytes":%d,"for":"render b","holder":"node-b","ttl":"1m"}`, 16*gib))
	ref := refusalOf(t, body)
	if code != 503 || ref.Reason != "reserved" || hdr.Get("Retry-After") == "" || !namesReservation(ref, "render a") {
		t.Fatalf("second take past the first: %d %s; want 503 reserved naming render a", code, body)
	}
	code, _, body = do(t, "POST", g.URL+"/vramgate/reservations", fmt.Sprintf(`{"device":0,"bytes":%d,"for":"short","holder":"node-b","ttl":"1s"}`, 2*gib))
	var short reservedAnswer
	if err := json.Unmarshal(body, &short); err != nil || code != 201 {
		t.Fatalf("short take: %d %s", code, body)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, _, body = do(t, "GET", g.URL+"/vramgate/reservations", "")
		if !strings.Contains(string(body), `"for":"short"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the 1 s reservation still listed after 10 s: %s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, _, body := do(t, "POST", g.URL+"/vramgate/reservations/"+short.Reservation.ID, `{"ttl":"1m"}`); code != 404 {
		t.Fatalf("extend after the TTL: %d %s; want 404", code, body)
	}
	if files, _ := filepath.Glob(filepath.Join(g.LeaseDir, "*.reserve")); len(files) != 1 {
		t.Fatalf("%d reservation files before the stop; want render a's", len(files))
	}
	if code := g.stop(t); code != 0 {
		t.Fatalf("stop: exit %d\n%s", code, g.Stderr)
	}
	if files, _ := filepath.Glob(filepath.Join(g.LeaseDir, "*.reserve")); len(files) != 0 {
		t.Fatalf("reservation files left after the gate stopped: %v", files)
	}
}

// A model that a request through the gate is still loading is kept by a
// make_room too: the room-making waits for the load the gate admitted to
// land, then plans with the loaded model, which it must not take for an
// idle one (the smaller, and so the library's pick, were it idle).
func TestMakeRoomKeepsAModelLoadingThroughTheGate(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{TotalVRAM: 8 * gib, Models: []vramguardtest.ModelConfig{
		{Name: "slow", Size: 2 * gib, Chunks: 3, LoadLatency: 1500 * time.Millisecond},
		{Name: "idle", Size: 3 * gib, Chunks: 3, LoadLatency: 20 * time.Millisecond},
	}})
	g := startGate(t, sim.URL().String(), sim.GPU())
	load(t, sim.APIClient(), "idle")
	answered := make(chan int, 1)
	go func() {
		code, _, _ := do(t, "POST", g.URL+"/api/generate", `{"model":"slow","prompt":"hi","stream":false}`)
		answered <- code
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := sim.WaitFor(ctx, func() bool {
		return slices.ContainsFunc(sim.Running(), func(r vramguardtest.RunnerState) bool { return strings.HasPrefix(r.Model, "slow") && r.Loading })
	}); err != nil {
		t.Fatalf("slow's load through the gate did not begin: %v", err)
	}
	// 5 GiB: slow alone (2 GiB, the smallest that is enough) or idle (3).
	code, _, body := do(t, "POST", g.URL+"/vramgate/reservations", `{"device":0,"bytes":5368709120,"for":"render","holder":"comfy-node","make_room":true}`)
	var a reservedAnswer
	if err := json.Unmarshal(body, &a); err != nil || code != 201 || a.Receipt == nil || !slices.Equal(a.Receipt.Evicted, []string{"idle:latest"}) {
		t.Fatalf("make_room beside a load through the gate: %d %s; want idle evicted, slow kept", code, body)
	}
	if code := <-answered; code != 200 || !sim.Listed("slow") {
		t.Fatalf("the request that loaded slow: %d, slow listed %v", code, sim.Listed("slow"))
	}
}
