// Package smi runs nvidia-smi and parses its CSV output.
//
// nvidia-smi's text is treated as untrusted: the parsers never panic, reject
// numbers that would overflow, and report lines they cannot read instead of
// guessing. Unknown values ("[N/A]", "[Not Supported]", any bracketed
// placeholder) are reported as unknown, never as zero.
//
// nvidia-smi does not quote CSV fields. A comma inside a GPU or process name
// is therefore recovered by position: the name is the only free-text field,
// so whatever lies between the fixed fields belongs to it.
package smi

import (
	"bytes"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Arguments for the two queries. The field order is what ParseGPUs and
// ParseApps expect.
const (
	QueryGPUs = "--query-gpu=index,name,uuid,memory.total,memory.used,memory.free"
	QueryApps = "--query-compute-apps=gpu_uuid,pid,used_memory,process_name"
	Format    = "--format=csv,noheader,nounits"
)

const mib = 1 << 20

// maxIndex bounds a device index; anything larger is garbage.
const maxIndex = 1 << 16

// GPU is one line of the GPU query.
type GPU struct {
	Index int
	Name  string // empty when nvidia-smi shows a placeholder
	UUID  string // empty when nvidia-smi shows a placeholder
	// Total, Used and Free are in bytes. MemoryKnown is false (and the
	// three are 0) when any of them is a placeholder.
	Total, Used, Free uint64
	MemoryKnown       bool
}

// App is one line of the compute-apps query.
type App struct {
	GPUUUID string
	PID     uint32
	// UsedBytes is 0 when UsedKnown is false ("[N/A]" in containers and
	// under WDDM).
	UsedBytes uint64
	UsedKnown bool
	Name      string // the executable path; empty when a placeholder
}

// ParseGPUs parses the output of the GPU query (QueryGPUs, Format). It
// returns every line it could read; err describes the first line it could
// not, and how many there were. Blank lines and nvidia-smi's "No devices
// were found" are not errors.
func ParseGPUs(out []byte) ([]GPU, error) {
	var (
		gpus []GPU
		bad  badLines
	)
	forEachLine(out, func(n int, line string) {
		g, err := parseGPU(line)
		if err == nil && indexOf(gpus, g.Index) >= 0 {
			err = fmt.Errorf("duplicate index %d", g.Index)
		}
		if err != nil {
			bad.add(n, line, err)
			return
		}
		gpus = append(gpus, g)
	})
	return gpus, bad.err()
}

// ParseApps parses the output of the compute-apps query (QueryApps,
// Format), like ParseGPUs. "No running processes found" is not an error.
func ParseApps(out []byte) ([]App, error) {
	var (
		apps []App
		bad  badLines
	)
	forEachLine(out, func(n int, line string) {
		a, err := parseApp(line)
		if err != nil {
			bad.add(n, line, err)
			return
		}
		apps = append(apps, a)
	})
	return apps, bad.err()
}

func parseGPU(line string) (GPU, error) {
	f := strings.Split(line, ",")
	if len(f) < 6 {
		return GPU{}, fmt.Errorf("%d fields, want 6", len(f))
	}
	var g GPU
	idx, err := strconv.Atoi(strings.TrimSpace(f[0]))
	if err != nil || idx < 0 || idx >= maxIndex {
		return GPU{}, fmt.Errorf("bad index %q", clip(f[0]))
	}
	g.Index = idx
	n := len(f)
	g.Name = text(strings.Join(f[1:n-4], ","))
	g.UUID = text(f[n-4])
	total, totalOK, err := parseMiB(f[n-3])
	if err != nil {
		return GPU{}, fmt.Errorf("memory.total: %w", err)
	}
	used, usedOK, err := parseMiB(f[n-2])
	if err != nil {
		return GPU{}, fmt.Errorf("memory.used: %w", err)
	}
	free, freeOK, err := parseMiB(f[n-1])
	if err != nil {
		return GPU{}, fmt.Errorf("memory.free: %w", err)
	}
	if totalOK && usedOK && freeOK {
		g.Total, g.Used, g.Free, g.MemoryKnown = total, used, free, true
	}
	return g, nil
}

func parseApp(line string) (App, error) {
	f := strings.Split(line, ",")
	if len(f) < 4 {
		return App{}, fmt.Errorf("%d fields, want 4", len(f))
	}
	var a App
	a.GPUUUID = text(f[0])
	if a.GPUUUID == "" {
		return App{}, fmt.Errorf("no gpu uuid")
	}
	pid, err := strconv.ParseUint(strings.TrimSpace(f[1]), 10, 32)
	if err != nil {
		return App{}, fmt.Errorf("bad pid %q", clip(f[1]))
	}
	a.PID = uint32(pid)
	a.UsedBytes, a.UsedKnown, err = parseMiB(f[2])
	if err != nil {
		return App{}, fmt.Errorf("used_memory: %w", err)
	}
	a.Name = text(strings.Join(f[3:], ","))
	return a, nil
}

// parseMiB parses a whole number of MiB. known is false for a placeholder.
func parseMiB(s string) (n uint64, known bool, err error) {
	s = strings.TrimSpace(s)
	if placeholder(s) {
		return 0, false, nil
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil || v > math.MaxUint64/mib {
		return 0, false, fmt.Errorf("bad MiB value %q", clip(s))
	}
	return v * mib, true, nil
}

// placeholder reports whether s is one of nvidia-smi's stand-ins for a
// value it cannot show: "[N/A]", "[Not Supported]", "[Insufficient
// Permissions]", "[Unknown Error]", and the bare "N/A" of older drivers.
func placeholder(s string) bool {
	return s == "N/A" || (len(s) >= 2 && s[0] == '[' && s[len(s)-1] == ']')
}

// text trims s and maps placeholders to "".
func text(s string) string {
	s = strings.TrimSpace(s)
	if placeholder(s) {
		return ""
	}
	return s
}

// forEachLine calls fn with the 1-based number and text of every line that
// is not blank and not one of nvidia-smi's "nothing to list" notices.
func forEachLine(out []byte, fn func(n int, line string)) {
	n := 0
	for len(out) > 0 {
		n++
		var raw []byte
		if i := bytes.IndexByte(out, '\n'); i >= 0 {
			raw, out = out[:i], out[i+1:]
		} else {
			raw, out = out, nil
		}
		line := strings.TrimSpace(string(raw)) // also drops Windows' \r
		switch {
		case line == "",
			strings.EqualFold(line, "No devices were found"),
			strings.EqualFold(line, "No running processes found"):
			continue
		}
		fn(n, line)
	}
}

func indexOf(gpus []GPU, index int) int {
	for i := range gpus {
		if gpus[i].Index == index {
			return i
		}
	}
	return -1
}

// badLines remembers the first unreadable line and counts the rest.
type badLines struct {
	count int
	first error
}

func (b *badLines) add(n int, line string, err error) {
	b.count++
	if b.first == nil {
		b.first = fmt.Errorf("line %d %q: %w", n, clip(line), err)
	}
}

func (b *badLines) err() error {
	switch b.count {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("unreadable nvidia-smi output: %w", b.first)
	default:
		return fmt.Errorf("unreadable nvidia-smi output (%d lines): %w", b.count, b.first)
	}
}

// clip shortens hostile text before it goes into an error message.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
