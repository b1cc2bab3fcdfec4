package comfyui

import (
	"strings"
	"testing"
)

const mib = 1 << 20

// TestJudge: the receipt's outcome from the readings before and after a
// free, as a table: never "freed" without a measurement that moved (or
// shows nothing held), pinned and unreturned memory named.
func TestJudge(t *testing.T) {
	gpu := func(proc, free uint64) reading {
		return reading{proc: proc, procKnown: true, held: proc, heldKnown: true, free: free, freeKnown: true, procsListed: true}
	}
	device := func(free uint64) reading { return reading{free: free, freeKnown: true} }
	both := func(proc, free, torch, torchFree uint64) reading {
		r := gpu(proc, free)
		r.torch, r.torchFree, r.statsKnown = torch, torchFree, true
		return r
	}
	stats := func(torch, torchFree uint64) reading {
		return reading{torch: torch, torchFree: torchFree, statsKnown: true}
	}
	const floor = 300 * mib // what the last settled free left
	tests := []struct {
		name          string
		before, after reading
		settled       bool
		reader        bool
		floor         uint64
		want          Outcome
		pinned        uint64
		notReturned   uint64
		pending       uint64
		noted         string // a NotChecked entry must contain it
	}{
		{name: "both moved", before: both(9000*mib, 1000*mib, 8700*mib, 700*mib), after: both(300*mib, 9700*mib, 0, 0), settled: true, reader: true, want: OutcomeFreed},
		{name: "DynamicVRAM: torch's pool about 0, the process freed", before: both(6400*mib, 1000*mib, 0, 0), after: both(300*mib, 7100*mib, 0, 0), settled: true, reader: true, want: OutcomeFreed},
		{name: "pinned by a custom node", before: both(9000*mib, 1000*mib, 8700*mib, 700*mib), after: both(2300*mib, 7700*mib, 2000*mib, 0), settled: true, reader: true, want: OutcomePartlyFreed, pinned: 2000 * mib},
		{name: "torch let go, the driver did not", before: both(9000*mib, 1000*mib, 8700*mib, 700*mib), after: both(9000*mib, 1000*mib, 0, 0), settled: true, reader: true, floor: floor, want: OutcomePartlyFreed, notReturned: 8700 * mib},
		{name: "not settled: pending, nothing pinned", before: both(9000*mib, 1000*mib, 8700*mib, 0), after: both(5000*mib, 5000*mib, 4000*mib, 0), settled: false, reader: true, floor: floor, want: OutcomePending, pending: 4700 * mib},
		{name: "settled on memory that did not move", before: gpu(2300*mib, 7700*mib), after: gpu(2300*mib, 7700*mib), settled: true, reader: true, floor: floor, want: OutcomePartlyFreed, pinned: 2000 * mib},
		{name: "nothing held beyond the floor", before: gpu(300*mib, 9700*mib), after: gpu(300*mib, 9700*mib), settled: true, reader: true, floor: floor, want: OutcomeFreed},
		{name: "stats only: never freed from torch's pool", before: stats(8700*mib, 0), after: stats(0, 0), settled: true, want: OutcomeNotMeasured, noted: "no reader"},
		{name: "reader only, moved", before: gpu(9000*mib, 1000*mib), after: gpu(300*mib, 9700*mib), settled: true, reader: true, want: OutcomeFreed, noted: "/system_stats"},
		{name: "device only, nothing moved", before: device(9700 * mib), after: device(9700 * mib), settled: true, reader: true, want: OutcomeNotMeasured, noted: "look alike"},
		{name: "nothing read", before: reading{}, after: reading{}, settled: false, want: OutcomeNotMeasured, noted: "no reader"},
		{name: "reader failed, stats down", before: reading{}, after: reading{}, reader: true, want: OutcomeNotMeasured, noted: "the GPU"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rc := &Receipt{Tolerance: DefaultTolerance, Settled: tt.settled, PID: 42}
			judge(rc, tt.before, tt.after, tt.reader, tt.floor)
			if rc.Outcome != tt.want || rc.Pinned != tt.pinned || rc.NotReturned != tt.notReturned || rc.Pending != tt.pending {
				t.Errorf("outcome %q, pinned %d MiB, not returned %d MiB, pending %d MiB; want %q, %d, %d, %d (%s)",
					rc.Outcome, rc.Pinned/mib, rc.NotReturned/mib, rc.Pending/mib, tt.want, tt.pinned/mib, tt.notReturned/mib, tt.pending/mib, rc)
			}
			if tt.noted != "" && !strings.Contains(strings.Join(rc.NotChecked, "|"), tt.noted) {
				t.Errorf("NotChecked %q; want one naming %q", rc.NotChecked, tt.noted)
			}
			if rc.Outcome == OutcomeFreed && rc.Released() == 0 && !strings.Contains(tt.name, "nothing") {
				t.Errorf("freed with nothing released: %s", rc)
			}
			if rc.Outcome != OutcomePartlyFreed && strings.Contains(rc.String(), "B pinned") {
				t.Errorf("a %s receipt calls memory pinned: %s", rc.Outcome, rc)
			}
		})
	}
}

// TestHoldsArgv: a process is ComfyUI's when its command line holds
// /system_stats' argv as a run, the script by base name.
func TestHoldsArgv(t *testing.T) {
	argv := []string{"main.py", "--listen", "--port", "8189"}
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{[]string{"/usr/bin/python3", "/opt/ComfyUI/main.py", "--listen", "--port", "8189"}, true},
		{[]string{"python", "main.py", "--listen", "--port", "8189", "--highvram"}, false},
		{[]string{"python", "main.py", "--listen"}, false},
		{[]string{"python", "other.py", "--listen", "--port", "8189"}, false},
		{nil, false},
	} {
		if got := holdsArgv(tt.args, argv); got != tt.want {
			t.Errorf("holdsArgv(%q) = %v, want %v", tt.args, got, tt.want)
		}
	}
}
