package probe

// What this machine's procfs shows: the runner processes (a gauge of
// /metrics) and whether the server watched runs here (for /ready).

import (
	"bytes"
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
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

// serverVisible reports whether the procfs root ("" for /proc) shows an
// `ollama serve` process. Only the command lines of processes named
// ollama* are read.
func serverVisible(root string) bool {
	if root == "" {
		root = "/proc"
	}
	ents, err := os.ReadDir(root)
	if err != nil {
		return false
	}
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join(root, e.Name(), "stat"))
		if err != nil {
			continue
		}
		i, j := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
		if i < 0 || j < i || !strings.HasPrefix(strings.ToLower(string(stat[i+1:j])), "ollama") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, e.Name(), "cmdline"))
		if err != nil || len(b) == 0 {
			continue
		}
		if gpu.ClassifyCommand(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")) == vramguard.RoleOllamaServer {
			return true
		}
	}
	return false
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
