package vramguard

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"
)

const roomGiB = 1 << 30

const unattributedWhy = "the reader cannot tell which device it is on; AllModels would unload it"

func model(name string, gib uint64) roomCand {
	return roomCand{name: name, bytes: gib * roomGiB, known: true, tier: tierModel}
}

// TestPlanRoom is the table of the one victim policy (planRoom and its
// choice within a tier, fewestBytes), the pool's cases included.
func TestPlanRoom(t *testing.T) {
	own := func(c roomCand) roomCand { c.tier = tierOwnModel; return c }
	busy := func(c roomCand) roomCand { c.tier = tierBusyModel; return c }
	tenant := func(name string, gib uint64, first bool) roomCand {
		c := roomCand{name: name, bytes: gib * roomGiB, known: gib > 0, tier: tierTenantLast}
		if first {
			c.tier = tierTenantFirst
		}
		return c
	}
	tests := []struct {
		name    string
		free    uint64 // GiB
		need    uint64 // GiB
		cands   []roomCand
		want    string // the steps, in order
		enough  bool
		unknown bool
		usesOwn bool
	}{
		{name: "room there", free: 8, need: 6, cands: []roomCand{model("a", 4)}, want: "", enough: true},
		{name: "smallest that is enough alone", free: 2, need: 6, cands: []roomCand{model("a", 8), model("b", 5), model("c", 2)}, want: "b", enough: true},
		{name: "fewest bytes beats largest first", free: 1, need: 10, cands: []roomCand{model("a", 8), model("b", 6), model("c", 2)},
			want: "a c", enough: true}, // 10 GiB; largest first would take a and b, 14
		{name: "tie on bytes: fewer models", free: 0, need: 4, cands: []roomCand{model("a", 2), model("b", 2), model("c", 4)}, want: "c", enough: true},
		{name: "tie on bytes and count: by name", free: 0, need: 4, cands: []roomCand{model("b", 4), model("a", 4)}, want: "a", enough: true},
		{name: "in vain: unloads nothing", free: 3, need: 10, cands: []roomCand{model("chat", 2)}, want: "chat", enough: false},
		{name: "nothing to evict", free: 4, need: 8, want: "", enough: false},
		{name: "own leased models last", free: 0, need: 4, cands: []roomCand{own(model("phase", 4)), model("a", 6)}, want: "a", enough: true},
		{name: "own only when the rest cannot", free: 0, need: 8, cands: []roomCand{own(model("phase", 4)), model("a", 6)},
			want: "a phase", enough: true, usesOwn: true},
		{name: "busy after own", free: 0, need: 4, cands: []roomCand{busy(model("run", 4)), own(model("phase", 4))}, want: "phase", enough: true, usesOwn: true},
		{name: "first tenant before models", free: 0, need: 4, cands: []roomCand{model("a", 4), tenant("comfy", 6, true)}, want: "comfy", enough: true},
		{name: "models before other tenants", free: 0, need: 4, cands: []roomCand{model("a", 4), tenant("comfy", 6, false)}, want: "a", enough: true},
		{name: "tenant tops up the models", free: 0, need: 12, cands: []roomCand{model("a", 8), tenant("comfy", 6, false)}, want: "a comfy", enough: true},
		// The tenant asked after the models frees 10 alone: the model is
		// not unloaded for nothing.
		{name: "an unload a later tenant makes unneeded", free: 11, need: 18, cands: []roomCand{model("small", 4), tenant("comfy", 10, false)},
			want: "comfy", enough: true},
		{name: "order across tiers", free: 6, need: 20, cands: []roomCand{tenant("b", 6, false), model("big", 8), tenant("a", 4, true)},
			want: "a big b", enough: true},
		{name: "unknown tenant is tried, not counted", free: 0, need: 12, cands: []roomCand{model("a", 8), tenant("comfy", 0, false)},
			want: "a comfy", enough: false, unknown: true},
		{name: "unknown tenant not needed", free: 0, need: 8, cands: []roomCand{model("a", 8), tenant("comfy", 0, false)}, want: "a", enough: true},
		// The pool's own cases: a member's plan (PlaceMadeRoom).
		{name: "pool: the runner that is enough, not all", free: 1, need: 6, cands: []roomCand{model("a", 3), model("b", 5)}, want: "b", enough: true},
		{name: "pool: phase's model spared", free: 1, need: 4, cands: []roomCand{own(model("p", 3)), model("a", 5)}, want: "a", enough: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := planRoom(roomView{free: tt.free * roomGiB, cands: tt.cands}, tt.need*roomGiB)
			if got := strings.Join(p.names(), " "); got != tt.want || p.enough != tt.enough || p.unknown != tt.unknown || p.usesOwn != tt.usesOwn {
				t.Errorf("plan %q enough=%v unknown=%v own=%v; want %q %v %v %v", got, p.enough, p.unknown, p.usesOwn, tt.want, tt.enough, tt.unknown, tt.usesOwn)
			}
		})
	}
}

// TestFewestBytesMany: past maxExactVictims candidates the choice is the smallest that
// is enough alone, else largest first, pruned; always enough when it can
// be, and never more than largest-first.
func TestFewestBytesMany(t *testing.T) {
	var cs []roomCand
	for i := range 20 {
		cs = append(cs, model(fmt.Sprintf("m%02d", i), uint64(i%5+1)))
	}
	for _, missing := range []uint64{1, 3, 5, 7, 12, 40, 60} {
		sel, got := fewestBytes(cs, missing*roomGiB)
		var sum uint64
		for _, c := range sel {
			sum += c.bytes
		}
		if sum != got || got < missing*roomGiB {
			t.Errorf("missing %d GiB: %d bytes chosen (%d reported), not enough", missing, sum, got)
		}
		if missing <= 5 && (len(sel) != 1 || sel[0].bytes != missing*roomGiB) {
			t.Errorf("missing %d GiB: %v; want the one model of that size", missing, sel)
		}
	}
	if sel, got := fewestBytes(cs, 1000*roomGiB); len(sel) != len(cs) || got != 60*roomGiB {
		t.Errorf("not enough: %d models, %d bytes; want all 20 (60 GiB)", len(sel), got)
	}
}

// TestBuildRoomView: a model counts for the device its runner is on, with
// the bytes the reader attributes (a split runner its share on each);
// several devices and no attribution keep it (unattributed); one device
// and no attribution count size_vram; the CPU and other devices hold no
// room here; kept models say why.
func TestBuildRoomView(t *testing.T) {
	runner := func(model string, gib uint64) GPUProcess {
		return GPUProcess{PID: 1, UsedBytes: gib * roomGiB, UsedKnown: true, Role: RoleOllamaRunner, Model: model}
	}
	dev := func(i int, free uint64, ps ...GPUProcess) DeviceMemory {
		return DeviceMemory{Index: i, Total: 24 * roomGiB, Free: free * roomGiB, ProcessesKnown: true, Processes: ps}
	}
	listed := func(names ...string) []api.ProcessModelResponse {
		var out []api.ProcessModelResponse
		for _, n := range names {
			out = append(out, api.ProcessModelResponse{Model: n, Name: n, SizeVRAM: 7 * roomGiB, Size: 7 * roomGiB})
		}
		return out
	}
	two := &VRAMSnapshot{Devices: []DeviceMemory{
		dev(0, 10, runner("big:latest", 6), runner("split:latest", 2)),
		dev(1, 2, runner("small:latest", 4), runner("split:latest", 3), GPUProcess{PID: 900, UsedBytes: 18 * roomGiB, UsedKnown: true, Role: RoleOther, Command: "comfyui"}),
	}}
	anon := &VRAMSnapshot{Devices: []DeviceMemory{{Index: 0, Total: 24 * roomGiB, Free: 10 * roomGiB}, {Index: 1, Total: 24 * roomGiB, Free: 2 * roomGiB}}}
	one := &VRAMSnapshot{Devices: []DeviceMemory{{Index: 0, Total: 24 * roomGiB, Free: 3 * roomGiB}}}
	cpu := []api.ProcessModelResponse{{Model: "cpu:latest", Name: "cpu:latest", Size: roomGiB}}
	leases := []LeaseInfo{{Model: "leased:latest", Program: "other", PID: 7}}
	rules := roomRules{
		protected: func(m string) bool { return NormalizeModelName(m) == "prot:latest" },
		leases:    leases, inUse: map[string]bool{"busy:latest": true}, own: map[string]bool{"mine:latest": true},
	}
	tests := []struct {
		name   string
		snap   *VRAMSnapshot
		device int
		listed []api.ProcessModelResponse
		rules  roomRules
		cands  string // name=GiB, in order
		kept   string // name:why
	}{
		{name: "device 1 only", snap: two, device: 1, listed: listed("big:latest", "small:latest", "split:latest"),
			cands: "small:latest=4 split:latest=3"},
		{name: "device 0 only", snap: two, device: 0, listed: listed("big:latest", "small:latest", "split:latest"),
			cands: "big:latest=6 split:latest=2"},
		{name: "several devices, no attribution", snap: anon, device: 1, listed: listed("big:latest", "small:latest"),
			kept: "big:latest:" + unattributedWhy + " small:latest:" + unattributedWhy},
		{name: "one device, no attribution: size_vram", snap: one, device: 0, listed: append(listed("a:latest"), cpu...),
			cands: "a:latest=7"},
		{name: "kept, and why", snap: one, device: 0, rules: rules,
			listed: listed("prot:latest", "leased:latest", "busy:latest", "mine:latest", "idle:latest"),
			cands:  "mine:latest=7 idle:latest=7", kept: "prot:latest:protected leased:latest:leased by other (pid 7) busy:latest:in use"},
		{name: "busy last when the caller allows", snap: one, device: 0, rules: roomRules{inUse: map[string]bool{"busy:latest": true}, busyLast: true},
			listed: listed("busy:latest"), cands: "busy:latest=7"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := buildRoomView(tt.snap, tt.snap.Device(tt.device), tt.listed, tt.rules, nil)
			var cands, kept []string
			for _, c := range v.cands {
				cands = append(cands, fmt.Sprintf("%s=%d", c.name, c.bytes/roomGiB))
			}
			for _, k := range v.kept {
				kept = append(kept, k.Model+":"+k.why())
			}
			if got := strings.Join(cands, " "); got != tt.cands {
				t.Errorf("candidates %q, want %q", got, tt.cands)
			}
			if got := strings.Join(kept, " "); got != tt.kept {
				t.Errorf("kept %q, want %q", got, tt.kept)
			}
		})
	}
	// A tenant's bytes: its own figure, else its process's on the device.
	ts := []tenantEntry{{id: 1, t: Tenant{Name: "sized", Bytes: 5 * roomGiB}}, {id: 2, t: Tenant{Name: "by pid", PID: 900, First: true}}, {id: 3, t: Tenant{Name: "unknown"}}}
	v := buildRoomView(two, two.Device(1), nil, roomRules{}, ts)
	got := slices.Collect(func(yield func(string) bool) {
		for _, c := range v.cands {
			yield(fmt.Sprintf("%s=%d/%v/%v", c.name, c.bytes/roomGiB, c.known, c.tier == tierTenantFirst))
		}
	})
	if want := "sized=5/true/false by pid=18/true/true unknown=0/false/false"; strings.Join(got, " ") != want {
		t.Errorf("tenants %q, want %q", strings.Join(got, " "), want)
	}
}
