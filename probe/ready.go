package probe

// GET /ready: the query, the answer, and the checks behind it.

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
	"github.com/vramguard/vramguard/internal/procs"
)

// Query is what /ready is asked. Its zero value asks only whether Ollama
// answers.
type Query struct {
	// Model, when not "", asks that the model be resident.
	Model string
	// Free asks for that many bytes free on Device, when HasFree.
	Free    uint64
	HasFree bool
	// Device is the device Free is asked of (0 unless HasDevice); with
	// HasDevice alone, the device must be in the GPU reader's snapshot.
	Device    int
	HasDevice bool
}

// ParseQuery reads /ready's query parameters: model=NAME, free=BYTES and
// device=N, each at most once. Any other parameter, an empty model, a
// free that is no byte count up to vramguard.MaxBytes or a device that is
// no index is a *vramguard.Error of vramguard.KindInvalidInput, whose Err
// is the message GET /ready answers with.
func ParseQuery(v url.Values) (Query, error) {
	q, err := parseQuery(v)
	if err != nil {
		return Query{}, &vramguard.Error{Op: "ready query", Kind: vramguard.KindInvalidInput, Err: err}
	}
	return q, nil
}

func parseQuery(v url.Values) (Query, error) {
	var q Query
	for k, vs := range v {
		if len(vs) != 1 {
			return q, fmt.Errorf("%s given %d times", k, len(vs))
		}
		s := vs[0]
		var err error
		switch k {
		case "model":
			q.Model = strings.TrimSpace(s)
			if q.Model == "" {
				return q, errors.New("model is empty")
			}
		case "free":
			q.HasFree = true
			if q.Free, err = strconv.ParseUint(s, 10, 64); err != nil || q.Free > vramguard.MaxBytes {
				return q, fmt.Errorf("free=%q: want a number of bytes", s)
			}
		case "device":
			q.HasDevice = true
			if q.Device, err = strconv.Atoi(s); err != nil || q.Device < 0 {
				return q, fmt.Errorf("device=%q: want a device index (0, 1, ...)", s)
			}
		default:
			return q, fmt.Errorf("unknown parameter %q (want model, free, device)", k)
		}
	}
	return q, nil
}

// Readiness is /ready's answer.
type Readiness struct {
	Ready bool `json:"ready"`
	// Model is what was found of Query.Model; nil when none was asked.
	Model *ModelState `json:"model,omitempty"`
	// Device is what was found of the device; nil when neither free nor
	// device was asked.
	Device *DeviceState `json:"device,omitempty"`
	// Reasons say why it is not ready; empty, never nil, when ready.
	Reasons []string `json:"reasons"`
}

// The states of a model (ModelState.State).
const (
	StateResident = "resident" // /api/ps lists it
	StateLoading  = "loading"  // a runner serves its weights, /api/ps does not list it yet (or lists it with no expiry)
	StateAbsent   = "absent"
	StateUnknown  = "unknown" // Ollama does not answer
)

// ModelState is what /api/ps and the runner processes say of a model.
type ModelState struct {
	// Name is the model's normalized name ("tiny:latest").
	Name  string `json:"name"`
	State string `json:"state"`
	// Verified: the state rests on the runner processes of the server
	// listening at the client's address as well as on /api/ps (Checked
	// "ps+runner-processes"), and they agree.
	Verified bool `json:"verified"`
	// Checked names the checks made: "ps+runner-processes", "ps", or
	// "none" when Ollama did not answer.
	Checked string `json:"checked"`
	// NoRunnerCheck says why the runner processes were not checked: a
	// remote server, a model with no weights blob, no `ollama serve` this
	// machine shows listening at the client's port (nothing listens
	// there, or the listener is another program, a server in a container
	// or another PID namespace, or one whose open files cannot be read),
	// or the socket tables or process table unreadable.
	NoRunnerCheck string   `json:"no_runner_check,omitempty"`
	RunnerPIDs    []uint32 `json:"runner_pids,omitempty"`
	// SizeVRAM and ExpiresAt are what /api/ps lists for a resident model.
	SizeVRAM  *int64     `json:"size_vram,omitempty"`
	ExpiresAt *time.Time `json:"expires_at,omitempty"`
}

// DeviceState is what the GPU reader says of the device asked for.
type DeviceState struct {
	Index int `json:"index"`
	// Free and Total are nil when device memory was not measured.
	Free    *uint64  `json:"free,omitempty"`
	Total   *uint64  `json:"total,omitempty"`
	Need    uint64   `json:"need"`
	Enough  bool     `json:"enough"`
	Holders []Holder `json:"holders"`
	// Reservations says whether other programs' reservations (see
	// vramguard.OllamaClient.Reserve) were counted: "counted" (Free is
	// what is left after them, and each is a holder of kind "reserved"),
	// or why not ("not checked: ..."), when the client has no GPU reader
	// (vramguard.Options.VRAM) or its reader lacks the device. A client
	// with vramguard.LeaseOptions.Off honours no reservation at all.
	Reservations string `json:"reservations"`
}

// Holder is a holder of device memory other than its free part, as
// vramguard.DeviceMemory.Holders names it.
type Holder struct {
	Kind  string `json:"kind"`
	Name  string `json:"name,omitempty"`
	PID   uint32 `json:"pid,omitempty"`
	Bytes uint64 `json:"bytes"`
}

// Ready answers q as GET /ready does: Ready is true when every condition
// asked for holds. Its reads of the server and the GPU end when ctx is
// done or Config.Timeout has passed; a read that did not end in time is
// a reason like any failure.
func (h *Handler) Ready(ctx context.Context, q Query) *Readiness {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	ans := &Readiness{Ready: true, Reasons: []string{}}
	fail := func(format string, args ...any) {
		ans.Ready = false
		ans.Reasons = append(ans.Reasons, fmt.Sprintf(format, args...))
	}
	if q.Model == "" && !q.HasFree && !q.HasDevice {
		if _, err := h.client.Running(ctx); err != nil {
			fail("Ollama at %s does not answer: %s", h.client.Host(), trim(err))
		}
		return ans
	}
	if q.Model != "" {
		ans.Model = h.modelState(ctx, q.Model, fail)
	}
	if q.HasFree || q.HasDevice {
		ans.Device = h.deviceState(ctx, q, fail)
	}
	return ans
}

// modelState is what /api/ps and the runner processes say of model.
func (h *Handler) modelState(ctx context.Context, model string, fail func(string, ...any)) *ModelState {
	name := vramguard.NormalizeModelName(model)
	m := &ModelState{Name: name, State: StateUnknown, Checked: "none"}
	ps, err := h.client.Running(ctx)
	if err != nil {
		fail("Ollama at %s does not answer: %s", h.client.Host(), trim(err))
		return m
	}
	m.Checked = vramguard.CheckPS.String()
	var listed *api.ProcessModelResponse
	for i := range ps {
		if vramguard.NormalizeModelName(ps[i].Model) == name || vramguard.NormalizeModelName(ps[i].Name) == name {
			listed = &ps[i]
			break
		}
	}
	pids, checked, why, notFound := h.runners(ctx, name)
	if checked {
		m.Checked = (vramguard.CheckPS | vramguard.CheckRunnerProcesses).String()
		m.RunnerPIDs = pids
	} else {
		m.NoRunnerCheck = why
	}
	running := len(pids) > 0
	switch {
	case listed != nil && listed.ExpiresAt.IsZero():
		m.State = StateLoading
		m.Verified = checked && running
		fail("%s is loading (/api/ps lists it with no expiry yet)", name)
	case listed != nil:
		size, at := listed.SizeVRAM, listed.ExpiresAt
		m.State, m.SizeVRAM, m.ExpiresAt = StateResident, &size, &at
		m.Verified = checked && running
		if checked && !running {
			fail("/api/ps lists %s but no live runner process serves its weights: a crashed runner stays listed until the next request reloads it", name)
		}
	case running:
		m.State, m.Verified = StateLoading, true
		fail("%s is loading: runner %s serves its weights, and Ollama lists a model only once its load has ended", name, joinPIDs(pids))
	default:
		m.State, m.Verified = StateAbsent, checked
		if notFound {
			fail("%s: model not found on the server", name)
		} else {
			fail("/api/ps does not list %s", name)
		}
	}
	return m
}

// runners returns the live runner processes of model's weights whose
// parent is the `ollama serve` listening at the client's port on this
// machine: checked is false when that cannot be told (why says why);
// notFound when the server does not know the model. A runner of another
// server on this machine (another port, another user's, a container's)
// is never counted.
func (h *Handler) runners(ctx context.Context, model string) (pids []uint32, checked bool, why string, notFound bool) {
	host := h.client.Host()
	if !isLocal(host) {
		return nil, false, "remote server", false
	}
	blob, err := h.client.ModelBlob(ctx, model)
	switch {
	case vramguard.KindOf(err) == vramguard.KindNotFound:
		return nil, false, "model not found", true
	case err != nil:
		return nil, false, "model blob: " + trim(err), false
	case blob == "":
		return nil, false, "the model has no weights file of its own", false
	}
	port, ok := portOf(host)
	if !ok {
		return nil, false, fmt.Sprintf("no port in %q", host), false
	}
	// Without the server at the client's address in sight, its runners
	// are not either: no runner seen would prove nothing, and a runner of
	// another server proves nothing of this one.
	server, why, err := procs.ListeningServer(h.procRoot, port)
	switch {
	case err != nil:
		return nil, false, "process table: " + err.Error(), false
	case server == 0:
		return nil, false, why, false
	}
	rs, err := procs.Runners(h.procRoot)
	if err != nil {
		return nil, false, "process table: " + err.Error(), false
	}
	for _, r := range rs {
		if r.ServerPID == server && (r.Blob == blob || (r.Model != "" && vramguard.NormalizeModelName(r.Model) == model)) {
			pids = append(pids, uint32(r.PID))
		}
	}
	return pids, true, "", false
}

// deviceState is what the GPU reader says of the device asked for.
func (h *Handler) deviceState(ctx context.Context, q Query, fail func(string, ...any)) *DeviceState {
	d := &DeviceState{Index: q.Device, Need: q.Free, Holders: []Holder{}}
	if h.vram == nil {
		fail("no GPU reader: device memory not measured")
		return d
	}
	snap, err := h.view(ctx, q.Device, d)
	if err != nil {
		fail("GPU snapshot failed: %s", trim(err))
		return d
	}
	dev := snap.Device(q.Device)
	if dev == nil {
		fail("no device %d in the GPU reader's snapshot", q.Device)
		return d
	}
	_ = gpu.NameRunners(ctx, h.client, snap) // unnamed runners keep their blob
	free, total := dev.Free, dev.Total
	d.Free, d.Total = &free, &total
	var held []string
	for _, x := range dev.Holders() {
		if x.Kind == vramguard.HolderFree {
			continue
		}
		d.Holders = append(d.Holders, Holder{Kind: string(x.Kind), Name: x.Name, PID: x.PID, Bytes: x.Bytes})
		who := string(x.Kind)
		if x.Name != "" {
			who += " " + x.Name
		}
		held = append(held, fmt.Sprintf("%s (%s)", who, human(x.Bytes)))
	}
	d.Enough = free >= q.Free
	if !d.Enough {
		by := "nothing"
		if len(held) > 0 {
			by = strings.Join(held, ", ")
		}
		fail("device %d has %s free of %s, %s needed; held by: %s", q.Device, human(free), human(total),
			human(q.Free), by)
	}
	return d
}

// view reads the device as the client sees it, other programs'
// reservations taken out of its free memory (the snapshot of a dry run of
// its EnsureFree); where the client cannot (no GPU reader of its own) it
// reads the Handler's reader and says in d that reservations were not
// checked.
func (h *Handler) view(ctx context.Context, device int, d *DeviceState) (*vramguard.VRAMSnapshot, error) {
	rep, err := h.client.EnsureFree(ctx, vramguard.EnsureRequest{Device: device, DryRun: true})
	switch {
	case err == nil && rep.Snapshot != nil:
		d.Reservations = "counted"
		return rep.Snapshot, nil
	case errors.Is(err, vramguard.ErrNoVRAMReader):
		d.Reservations = "not checked: the client has no GPU reader (vramguard.Options.VRAM)"
	case errors.Is(err, vramguard.KindNotFound):
		d.Reservations = "not checked: the client's GPU reader lists no such device"
	default:
		return nil, err
	}
	return h.vram.Snapshot(ctx)
}

func joinPIDs(pids []uint32) string {
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = strconv.FormatUint(uint64(p), 10)
	}
	return strings.Join(s, ", ")
}

// trim returns err's text on one line, without the repeated package prefix.
func trim(err error) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(err.Error(), "vramguard: ", "")), " ")
}

// human formats n bytes in binary units.
func human(n uint64) string {
	const (
		kib = 1 << 10
		mib = 1 << 20
		gib = 1 << 30
	)
	switch {
	case n >= gib:
		return fmt.Sprintf("%.1f GiB", float64(n)/gib)
	case n >= mib:
		return fmt.Sprintf("%.1f MiB", float64(n)/mib)
	case n >= kib:
		return fmt.Sprintf("%.1f KiB", float64(n)/kib)
	default:
		return fmt.Sprintf("%d B", n)
	}
}
