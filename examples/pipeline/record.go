package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/vramguard/vramguard"
)

// sample is device memory at one moment.
type sample struct {
	at   time.Duration
	used []uint64 // per device, by position in the snapshot
}

// event is a lifecycle event, drawn as a marker.
type event struct {
	at    time.Duration
	kind  string // "admitted", "load", "unload requested", "eviction verified", "oom"
	model string
}

// span is a pipeline step, drawn as a band.
type span struct {
	name     string
	from, to time.Duration
}

// row is one line of the printed timeline.
type row struct {
	at       time.Duration
	step     string
	resident []string
	used     uint64
	free     uint64
	known    bool // device memory known
	source   string
	note     string
}

// recorder collects what the pipeline did, for the table and the picture.
// It is safe for concurrent use (hooks call it from the client's goroutines).
type recorder struct {
	start time.Time

	mu      sync.Mutex
	devices []string // device names, from the first snapshot
	total   uint64   // of device 0
	samples []sample
	events  []event
	spans   []span
	rows    []row
	pending []string // notes for the next row: evictions the budget made
}

func newRecorder() *recorder { return &recorder{start: time.Now()} }

func (r *recorder) now() time.Duration { return time.Since(r.start) }

func (r *recorder) event(kind, model string) { r.eventAt(time.Now(), kind, model) }

func (r *recorder) eventAt(at time.Time, kind, model string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, event{at: at.Sub(r.start), kind: kind, model: model})
}

func (r *recorder) hooks() vramguard.Hooks {
	return vramguard.Hooks{
		OnAdmission: func(_ context.Context, e vramguard.AdmissionEvent) {
			if e.Err == nil {
				r.event("admitted", e.Model)
			}
		},
		OnCallEnd: func(_ context.Context, e vramguard.CallEnd) {
			if e.Generation != nil && e.Generation.Loaded {
				r.event("load", e.Generation.Model)
			}
		},
		OnUnloadEnd: func(_ context.Context, e vramguard.UnloadEnd) {
			if e.Report.Attempts > 0 { // a request went (not a model a lease kept)
				r.eventAt(e.Start, "unload requested", e.Model)
				if e.Cause == vramguard.CauseBudget {
					r.eventAt(e.Start, "budget eviction", e.Model)
					r.note("budget made room: unloaded " + e.Model)
				}
			}
			if e.Err == nil && e.Report.Verified {
				r.event("eviction verified", e.Model)
			}
		},
	}
}

// note adds a note to the next row.
func (r *recorder) note(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pending = append(r.pending, s)
}

// sampleOnce records one snapshot; a reader error is skipped.
func (r *recorder) sampleOnce(ctx context.Context, reader vramguard.VRAMReader) {
	if reader == nil {
		return
	}
	snap, err := reader.Snapshot(ctx)
	if err != nil || len(snap.Devices) == 0 {
		return
	}
	s := sample{at: r.now()}
	for _, d := range snap.Devices {
		s.used = append(s.used, d.Used)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.devices == nil {
		for _, d := range snap.Devices {
			r.devices = append(r.devices, fmt.Sprintf("GPU %d: %s", d.Index, d.Name))
		}
		r.total = snap.Devices[0].Total
	}
	r.samples = append(r.samples, s)
}

// sampleEvery samples until ctx is done; the caller joins it.
func (r *recorder) sampleEvery(ctx context.Context, reader vramguard.VRAMReader, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		r.sampleOnce(ctx, reader)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// step runs fn as a named step and records its span.
func (r *recorder) step(name string, fn func() error) error {
	from := r.now()
	err := fn()
	r.mu.Lock()
	r.spans = append(r.spans, span{name: name, from: from, to: r.now()})
	r.mu.Unlock()
	return err
}

// addRow records a timeline row with the server's resident models and the
// device's memory.
func (r *recorder) addRow(ctx context.Context, c *vramguard.OllamaClient, reader vramguard.VRAMReader, step, note string) {
	rw := row{at: r.now(), step: step, note: note, source: vramguard.SourceNone}
	if ms, err := c.Running(ctx); err == nil {
		for _, m := range ms {
			rw.resident = append(rw.resident, m.Model)
		}
		slices.Sort(rw.resident) // /api/ps orders by expiry: by name, the table reads the same every run
	}
	if reader != nil {
		if snap, err := reader.Snapshot(ctx); err == nil && len(snap.Devices) > 0 {
			rw.used, rw.free, rw.known, rw.source = snap.Devices[0].Used, snap.Devices[0].Free, true, snap.Source
		}
	}
	r.mu.Lock()
	if len(r.pending) > 0 {
		rw.note = strings.Join(append(r.pending, rw.note), "; ")
		rw.note = strings.TrimSuffix(rw.note, "; ")
		r.pending = nil
	}
	r.rows = append(r.rows, rw)
	r.mu.Unlock()
}

func gb(b uint64) string { return fmt.Sprintf("%.1f GB", float64(b)/1e9) }

// printTable writes the timeline in the style of the original plan's table.
func (r *recorder) printTable(w io.Writer) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TIME\tSTEP\tRESIDENT (/api/ps)\tUSED\tFREE\tSOURCE\tNOTE")
	for _, rw := range r.rows {
		res := "-"
		if len(rw.resident) > 0 {
			res = strings.Join(rw.resident, ", ")
		}
		used, free := "not measured", "-"
		if rw.known {
			used, free = gb(rw.used), gb(rw.free)
		}
		fmt.Fprintf(tw, "%5.2fs\t%s\t%s\t%s\t%s\t%s\t%s\n", rw.at.Seconds(), rw.step, res, used, free, rw.source, rw.note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	// tabwriter pads the last column too: no trailing blanks.
	for _, l := range strings.SplitAfter(b.String(), "\n") {
		if _, err := io.WriteString(w, strings.TrimRight(l, " \n")+strings.Repeat("\n", strings.Count(l, "\n"))); err != nil {
			return err
		}
	}
	return nil
}
