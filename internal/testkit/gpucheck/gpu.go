package main

import (
	"context"
	"fmt"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
	"github.com/vramguard/vramguard/internal/sleep"
)

// findProcess returns the device and process entry of pid in snap.
func findProcess(snap *vramguard.VRAMSnapshot, pid uint32) (*vramguard.DeviceMemory, *vramguard.GPUProcess) {
	for i := range snap.Devices {
		d := &snap.Devices[i]
		for j := range d.Processes {
			if d.Processes[j].PID == pid {
				return d, &d.Processes[j]
			}
		}
	}
	return nil, nil
}

// awaitHolder polls NVML until pid holds at least want bytes on some
// device and returns that snapshot.
func (c *checker) awaitHolder(ctx context.Context, pid uint32, want uint64) (*vramguard.VRAMSnapshot, error) {
	end := time.Now().Add(15 * time.Second)
	var last error
	for {
		snap, err := c.nvml.Snapshot(ctx)
		if err == nil {
			d, p := findProcess(snap, pid)
			switch {
			case p == nil:
				last = fmt.Errorf("runner %d not among the GPU's processes", pid)
			case !p.UsedKnown:
				last = fmt.Errorf("runner %d listed on device %d without a memory figure", pid, d.Index)
			case p.UsedBytes < want:
				last = fmt.Errorf("runner %d holds %d bytes on device %d, want at least %d", pid, p.UsedBytes, d.Index, want)
			default:
				return snap, nil
			}
		} else {
			last = err
		}
		if time.Now().After(end) {
			return nil, last
		}
		if err := sleep.Ctx(ctx, c.cfg.Poll); err != nil {
			return nil, err
		}
	}
}

// driverFree is what the 10 ms NVML poll saw after a round's call began.
type driverFree struct {
	pidGone, free time.Duration // -1 when not seen
}

// watchDriver polls NVML every cfg.Poll from t0 until pid is gone from
// device dev's processes and its free memory has risen by three quarters
// of the held bytes over freeLoaded, or until ctx ends.
func (c *checker) watchDriver(ctx context.Context, t0 time.Time, dev int, pid uint32, freeLoaded, held uint64) <-chan driverFree {
	out := make(chan driverFree, 1)
	go func() {
		res := driverFree{pidGone: -1, free: -1}
		defer func() { out <- res }()
		for {
			snap, err := c.nvml.Snapshot(ctx)
			if err == nil {
				at := time.Since(t0)
				_, p := findProcess(snap, pid)
				if p == nil && res.pidGone < 0 {
					res.pidGone = at
				}
				if d := snap.Device(dev); d != nil && p == nil && d.Free >= freeLoaded+held*3/4 && res.free < 0 {
					res.free = at
				}
				if res.pidGone >= 0 && res.free >= 0 {
					return
				}
			}
			if sleep.Ctx(ctx, c.cfg.Poll) != nil {
				return
			}
		}
	}()
	return out
}

// gpuRound checks the holder, frees it in r.Mode and times the call
// against the driver.
func (c *checker) gpuRound(ctx context.Context, r *round) {
	want := uint64(c.cfg.DeviceBytes)
	snap, err := c.awaitHolder(ctx, r.RunnerPID, want)
	if err != nil {
		r.Err = err.Error()
		return
	}
	if err := gpu.NameRunners(ctx, c.client, snap); err != nil {
		r.Err = "NameRunners: " + err.Error()
		return
	}
	d, p := findProcess(snap, r.RunnerPID)
	r.Device, r.RunnerUsed, r.Model, r.Role, r.Blob = d.Index, p.UsedBytes, p.Model, p.Role.String(), p.Blob
	r.FreeLoaded = d.Free
	if r.N == 1 {
		if err := c.compareReaders(ctx, "runner loaded"); err != nil {
			c.fail("readers with the runner loaded: %v", err)
		}
		c.rep.Attribution = &attribution{PID: p.PID, Model: p.Model, Role: p.Role.String(), Blob: p.Blob,
			UsedBytes: p.UsedBytes, Command: p.Command, Device: d.Index, DeviceName: d.Name}
	}
	if p.Model != model+":latest" || p.Role != vramguard.RoleOllamaRunner {
		r.Err = fmt.Sprintf("holder %d named %q (%s), want %q (%s)", p.PID, p.Model, p.Role, model+":latest", vramguard.RoleOllamaRunner)
		return
	}

	wctx, stop := context.WithTimeout(ctx, 30*time.Second)
	defer stop()
	t0 := time.Now()
	watch := c.watchDriver(wctx, t0, d.Index, r.RunnerPID, r.FreeLoaded, want)
	switch r.Mode {
	case modeUnload:
		var u *vramguard.UnloadReport
		if u, err = c.client.UnloadModel(ctx, model); u != nil {
			r.Verified, r.Checked, r.VRAMFreed = u.Verified, u.Checked.String(), u.VRAMFreed
		}
	case modeEnsure:
		need := r.FreeLoaded + want/2
		var e *vramguard.EnsureReport
		if e, err = c.client.EnsureFree(ctx, vramguard.EnsureRequest{Device: d.Index, Bytes: need, Timeout: 30 * time.Second}); e != nil {
			r.Verified = len(e.Evicted) == 1 && e.Evicted[0].Verified && e.FreeAfter >= need
			r.VRAMFreed = int64(e.FreeAfter) - int64(e.FreeBefore)
			if len(e.Evicted) == 1 {
				r.Checked = e.Evicted[0].Checked.String()
			}
		}
	case modeAwait:
		if err = c.rawUnload(ctx); err == nil {
			var s *vramguard.VRAMSnapshot
			s, err = vramguard.AwaitFree(ctx, c.nvml, vramguard.AwaitRequest{Device: d.Index, Bytes: r.FreeLoaded + want*3/4, PollInterval: c.cfg.Poll, Timeout: 30 * time.Second})
			if err == nil {
				r.Verified = true
				if dd := s.Device(d.Index); dd != nil {
					r.VRAMFreed = int64(dd.Free) - int64(r.FreeLoaded)
				}
			}
		}
	}
	r.CallMS = ms(time.Since(t0))
	// The truth at return: one more reading, straight after the call.
	if after, serr := c.nvml.Snapshot(ctx); serr == nil {
		_, still := findProcess(after, r.RunnerPID)
		dd := after.Device(d.Index)
		r.FreeAtReturn = still == nil && dd != nil && dd.Free >= r.FreeLoaded+want*3/4
	}
	res := <-watch
	r.PIDGoneMS, r.DriverFreeMS = msOr(res.pidGone), msOr(res.free)
	switch {
	case err != nil:
		r.Err = err.Error()
	case !r.Verified:
		r.Err = "not verified"
	case res.free < 0:
		r.Err = "the driver did not report the memory free within 30 s"
	case !r.FreeAtReturn:
		r.Err = "the call returned before the driver reported the memory free"
	}
}

func msOr(d time.Duration) float64 {
	if d < 0 {
		return -1
	}
	return ms(d)
}

// compareSnapshots compares an NVML and an nvidia-smi snapshot taken one
// after the other. Totals must agree to a MiB (nvidia-smi prints MiB),
// every process one lists the other must list, with the same memory to
// 2 MiB. Used and free are recorded, not checked: NVML's Used includes the
// driver's reserve, nvidia-smi's may not, and the two reads are not at the
// same instant.
func compareSnapshots(when string, nv, sm *vramguard.VRAMSnapshot) readerComparison {
	cmp := readerComparison{When: when}
	const mib = 1 << 20
	if len(nv.Devices) != len(sm.Devices) {
		cmp.Mismatches = append(cmp.Mismatches, fmt.Sprintf("nvml lists %d devices, nvidia-smi %d", len(nv.Devices), len(sm.Devices)))
	}
	for _, a := range nv.Devices {
		dc := deviceComparison{Index: a.Index, Name: a.Name, UUID: a.UUID,
			NVML: figures{Total: a.Total, Used: a.Used, Free: a.Free, Processes: procFigures(a)}}
		b := sm.Device(a.Index)
		if b == nil {
			cmp.Mismatches = append(cmp.Mismatches, fmt.Sprintf("device %d: not in nvidia-smi's list", a.Index))
			cmp.Devices = append(cmp.Devices, dc)
			continue
		}
		dc.SMI = figures{Total: b.Total, Used: b.Used, Free: b.Free, Processes: procFigures(*b)}
		dc.TotalDiffMiB = float64(int64(a.Total)-int64(b.Total)) / mib
		dc.UsedDiffMiB = float64(int64(a.Used)-int64(b.Used)) / mib
		dc.FreeDiffMiB = float64(int64(a.Free)-int64(b.Free)) / mib
		if dc.TotalDiffMiB > 1 || dc.TotalDiffMiB < -1 {
			cmp.Mismatches = append(cmp.Mismatches, fmt.Sprintf("device %d: total differs by %.1f MiB", a.Index, dc.TotalDiffMiB))
		}
		if a.UUID != "" && b.UUID != "" && a.UUID != b.UUID {
			cmp.Mismatches = append(cmp.Mismatches, fmt.Sprintf("device %d: uuid %s vs %s", a.Index, a.UUID, b.UUID))
		}
		if a.ProcessesKnown && b.ProcessesKnown {
			for _, p := range a.Processes {
				q := findIn(b.Processes, p.PID)
				switch {
				case q == nil:
					cmp.Mismatches = append(cmp.Mismatches, fmt.Sprintf("device %d: pid %d in nvml's list only", a.Index, p.PID))
				case p.UsedKnown && q.UsedKnown && absDiff(p.UsedBytes, q.UsedBytes) > 2*mib:
					cmp.Mismatches = append(cmp.Mismatches, fmt.Sprintf("device %d: pid %d holds %d bytes per nvml, %d per nvidia-smi", a.Index, p.PID, p.UsedBytes, q.UsedBytes))
				}
			}
			for _, q := range b.Processes {
				if findIn(a.Processes, q.PID) == nil {
					cmp.Mismatches = append(cmp.Mismatches, fmt.Sprintf("device %d: pid %d in nvidia-smi's list only", a.Index, q.PID))
				}
			}
		} else {
			dc.Note = fmt.Sprintf("process lists known: nvml %v, nvidia-smi %v", a.ProcessesKnown, b.ProcessesKnown)
		}
		cmp.Devices = append(cmp.Devices, dc)
	}
	return cmp
}

func procFigures(d vramguard.DeviceMemory) []procFigure {
	var out []procFigure
	for _, p := range d.Processes {
		out = append(out, procFigure{PID: p.PID, UsedBytes: p.UsedBytes, UsedKnown: p.UsedKnown, Role: p.Role.String(), Command: p.Command})
	}
	return out
}

func findIn(ps []vramguard.GPUProcess, pid uint32) *vramguard.GPUProcess {
	for i := range ps {
		if ps[i].PID == pid {
			return &ps[i]
		}
	}
	return nil
}

func absDiff(a, b uint64) uint64 {
	if a > b {
		return a - b
	}
	return b - a
}
