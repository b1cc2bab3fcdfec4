package vramotel

// The gauges read at collection time: the models watched clients' servers
// list, and device memory by holder.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ollama/ollama/api"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/pool"
)

// collectTimeout bounds one collection's reads (/api/ps of every watched
// client, the VRAM snapshot), which run concurrently: a server or a
// driver that hangs costs a collection this much, and no more.
const collectTimeout = 2 * time.Second

// watchList is the set of clients whose servers' models the gauges
// report.
type watchList struct {
	mu      sync.Mutex
	clients []*vramguard.OllamaClient // one entry per Watch call
	pools   map[*vramguard.OllamaClient]*pool.Pool
	closed  bool
}

// pool is the pool whose client c is, when WatchPool watched it.
func (w *watchList) pool(c *vramguard.OllamaClient) *pool.Pool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pools[c]
}

func (w *watchList) add(c *vramguard.OllamaClient) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.clients = append(w.clients, c)
	return true
}

// remove drops one entry of c.
func (w *watchList) remove(c *vramguard.OllamaClient) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if k := slices.Index(w.clients, c); k >= 0 {
		w.clients = slices.Delete(w.clients, k, k+1)
	}
	if !slices.Contains(w.clients, c) {
		delete(w.pools, c)
	}
}

func (w *watchList) list() []*vramguard.OllamaClient {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []*vramguard.OllamaClient // a client watched twice is listed once
	for _, c := range w.clients {
		if !slices.Contains(out, c) {
			out = append(out, c)
		}
	}
	return out
}

func (w *watchList) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.closed, w.clients = true, nil
}

// Watch makes the gauges vramguard.model.resident and vramguard.model.vram
// report the models c's server lists (c.Running, at each collection, under
// a timeout of 2 s shared with the other reads of the collection), until
// stop is called. The points carry the model as /api/ps names it
// ("llama3.2:latest") and the server as c.Host() names it (server.address,
// server.port), as the call spans and metrics of c's hooks do. A failed listing leaves
// that client's residency points out of the collection and is returned
// to the SDK, which reports it through its error handler; stop the watch
// before closing c, whose listings then fail.
//
// Watch is safe for concurrent use; stop is idempotent. After Close, or
// for a nil client, Watch does nothing.
func (i *Instrumentation) Watch(c *vramguard.OllamaClient) (stop func()) {
	if c == nil || !i.watch.add(c) {
		return func() {}
	}
	return sync.OnceFunc(func() { i.watch.remove(c) })
}

// WatchPool is Watch of the pool's client (whose server is the pool's own
// address, pool.Host), and the gauge vramguard.pool.member.up reports each
// member (Pool.Members, which reads no server): 1 while it answers, else
// 0. A nil pool watches nothing.
func (i *Instrumentation) WatchPool(p *pool.Pool) (stop func()) {
	if p == nil || !i.watch.add(p.OllamaClient) {
		return func() {}
	}
	i.watch.mu.Lock()
	if i.watch.pools == nil {
		i.watch.pools = map[*vramguard.OllamaClient]*pool.Pool{}
	}
	i.watch.pools[p.OllamaClient] = p
	i.watch.mu.Unlock()
	return sync.OnceFunc(func() { i.watch.remove(p.OllamaClient) })
}

// observe is the gauges' callback.
func (i *Instrumentation) observe(ctx context.Context, o metric.Observer) error {
	ctx, cancel := context.WithTimeout(ctx, collectTimeout)
	defer cancel()
	clients := i.watch.list()
	lists := make([][]api.ProcessModelResponse, len(clients))
	errs := make([]error, len(clients)+1)
	var snap *vramguard.VRAMSnapshot
	var wg sync.WaitGroup
	for k, c := range clients {
		wg.Go(func() {
			defer recovered(&errs[k])
			lists[k], errs[k] = c.Running(ctx)
		})
	}
	if i.vram != nil {
		wg.Go(func() {
			defer recovered(&errs[len(clients)])
			snap, errs[len(clients)] = i.vram.Snapshot(ctx)
		})
	}
	wg.Wait()
	for k, c := range clients {
		var members []pool.MemberStatus
		if p := i.watch.pool(c); p != nil {
			members = p.Members()
		}
		for _, m := range members {
			up := int64(0)
			if m.Up {
				up = 1
			}
			o.ObserveInt64(i.m.memberUp, up, metric.WithAttributes(attribute.String(AttrPoolMember, m.Name)))
		}
		if errs[k] != nil {
			continue
		}
		srv := i.cache.server(c.Host())
		for _, m := range lists[k] {
			kv := append([]attribute.KeyValue{metricModel(cmp.Or(m.Model, m.Name))}, srv...)
			o.ObserveInt64(i.m.resident, 1, metric.WithAttributes(kv...))
			o.ObserveInt64(i.m.modelVRAM, m.SizeVRAM, metric.WithAttributes(kv...))
		}
	}
	if snap != nil {
		i.observeDevices(o, snap)
	}
	return errors.Join(errs...)
}

// observeDevices reports each device's memory by holder. Holders of one
// kind and name (two processes of one command) are one point, their sum,
// so that the points of a device still add up to its total.
func (i *Instrumentation) observeDevices(o metric.Observer, snap *vramguard.VRAMSnapshot) {
	for _, d := range snap.Devices {
		if len(i.devices) > 0 && !slices.Contains(i.devices, d.Index) {
			continue
		}
		for _, h := range mergeHolders(d.Holders()) {
			kv := []attribute.KeyValue{attribute.Int(AttrDeviceIndex, d.Index), attribute.String(AttrMemoryHolderKind, string(h.Kind))}
			if h.Name != "" {
				kv = append(kv, attribute.String(AttrMemoryHolder, h.Name))
			}
			o.ObserveInt64(i.m.deviceMemory, bytes64(h.Bytes), metric.WithAttributes(kv...))
		}
	}
}

// mergeHolders sums the holders of one kind and name, in the order of
// their first appearance.
func mergeHolders(hs []vramguard.MemoryHolder) []vramguard.MemoryHolder {
	out := hs[:0:0]
	for _, h := range hs {
		k := slices.IndexFunc(out, func(o vramguard.MemoryHolder) bool { return o.Kind == h.Kind && o.Name == h.Name })
		if k < 0 {
			out = append(out, h)
			continue
		}
		out[k].Bytes += h.Bytes
	}
	return out
}

// recovered turns a panic of a reader (a VRAMReader is the user's code)
// into the collection's error, as background work must not crash the
// program.
func recovered(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("vramotel: collection panicked: %v", r)
	}
}
