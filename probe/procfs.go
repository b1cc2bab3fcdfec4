package probe

// What this machine's procfs shows: the runner processes (a gauge of
// /metrics), and where the server watched runs and listens (for /ready).

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/gpu"
)

// runnerCollector exports the runner processes procfs shows, which need
// no GPU reader: an orphan (its ollama serve gone) holds memory until
// killed.
type runnerCollector struct {
	h    *Handler
	desc *prometheus.Desc
}

var _ prometheus.Collector = (*runnerCollector)(nil)

func newRunnerCollector(h *Handler) *runnerCollector {
	return &runnerCollector{h: h, desc: prometheus.NewDesc("vramwatch_runner_processes",
		"Ollama runner processes this machine's /proc shows, by the model each serves (\"\" when not known) and whether the ollama serve that started it is gone.",
		[]string{"model", "server_gone"}, nil)}
}

func (rc *runnerCollector) Describe(ch chan<- *prometheus.Desc) { ch <- rc.desc }

func (rc *runnerCollector) Collect(ch chan<- prometheus.Metric) {
	ps, err := gpu.ProcRunners(rc.h.procRoot)
	if err != nil || len(ps) == 0 {
		return
	}
	// One device that stands for the machine, for gpu.NameRunners.
	snap := &vramguard.VRAMSnapshot{Source: "procfs", Taken: time.Now(), Devices: []vramguard.DeviceMemory{{Processes: ps}}}
	ctx, cancel := context.WithTimeout(context.Background(), rc.h.timeout)
	defer cancel()
	_ = gpu.NameRunners(ctx, rc.h.client, snap)
	type key struct{ model, gone string }
	n := map[key]int{}
	for _, p := range snap.Devices[0].Processes {
		model := p.Model
		if model != "" {
			model = vramguard.NormalizeModelName(model)
		}
		n[key{model, strconv.FormatBool(p.Orphaned)}]++
	}
	for k, v := range n {
		ch <- prometheus.MustNewConstMetric(rc.desc, prometheus.GaugeValue, float64(v), k.model, k.gone)
	}
}

// isLocal reports whether the server at host runs on this machine: its
// host is localhost, a loopback or the unspecified address. Names are
// not resolved.
func isLocal(host string) bool {
	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	u, err := url.Parse(host)
	if err != nil {
		return false
	}
	name := strings.TrimSuffix(strings.ToLower(u.Hostname()), ".")
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	ip := net.ParseIP(name)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

// portOf returns the TCP port of the server at host (a URL, or
// host[:port]): Ollama's 11434 when it names none (443 for https).
func portOf(host string) (int, bool) {
	if !strings.Contains(host, "://") {
		host = "http://" + host
	}
	u, err := url.Parse(host)
	if err != nil {
		return 0, false
	}
	p := u.Port()
	switch {
	case p != "":
	case u.Scheme == "https":
		return 443, true
	default:
		return 11434, true
	}
	n, err := strconv.ParseUint(p, 10, 16)
	if err != nil || n == 0 {
		return 0, false
	}
	return int(n), true
}
