package vramguard

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vramguard/vramguard/internal/lease"
	"github.com/vramguard/vramguard/internal/procs"
)

// unloadSettle is how long after the last unload request the model must
// still be absent, from /api/ps and the process table, before an unload on
// a local server is verified. Ollama starts the runner some 20 ms after
// the request that loads a model (and lists nothing in /api/ps until the
// load ends), so a load that began just before the unload shows only then.
const unloadSettle = 50 * time.Millisecond

// isLocalHost reports whether the server at host (a URL as the client
// keeps it, or host[:port]) runs on this machine: its host is "localhost"
// (or a name under .localhost), a loopback address, or the unspecified
// address (0.0.0.0, ::), which connects to this machine. Names are not
// resolved: any other name counts as remote.
func isLocalHost(host string) bool {
	if host == "" {
		return false
	}
	name := host
	if strings.Contains(host, "://") {
		u, err := url.Parse(host)
		if err != nil {
			return false
		}
		name = u.Hostname()
	} else if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.ToLower(strings.Trim(name, "[]")), ".")
	if name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	if i := strings.IndexByte(name, '%'); i >= 0 { // fe80::1%eth0
		name = name[:i]
	}
	ip := net.ParseIP(name)
	return ip != nil && (ip.IsLoopback() || ip.IsUnspecified())
}

// runnerWatch looks for the runner processes of one model's weights on
// this machine, for one unloadModel call.
type runnerWatch struct {
	root    string       // procfs root, "" for /proc
	blob    string       // "sha256:<hex>"
	path    string       // the weights file as the server names it; "" if unknown
	servers map[int]bool // the `ollama serve` PIDs that answer at the client's address
}

// serverHosts are the addresses of the servers that answer the client's
// requests: its own, or the ones its transport forwards to, when
// Options.HTTPClient's Transport names them with a method
// Servers() []string (package pool's does).
func (c *OllamaClient) serverHosts() []string {
	if c.opts.HTTPClient != nil {
		if s, ok := c.opts.HTTPClient.Transport.(interface{ Servers() []string }); ok {
			return s.Servers()
		}
	}
	return []string{c.host}
}

// servingServers returns the PIDs of the `ollama serve` processes that
// listen at hosts, or why the runner check cannot be tied to them: a
// runner of another server on this machine must not pass for one of the
// client's. again reports that nothing listens at them: a local server
// that is restarting (or down, when no listing answers either), whose
// check is worth setting up again once it listens. Of several servers (a
// pool's members), one where nothing listens is left out: it runs no
// runner an unload could reach (a runner whose server is gone is never
// counted).
func (c *OllamaClient) servingServers(hosts []string) (_ map[int]bool, why string, again bool) {
	if len(hosts) == 0 {
		return nil, "the transport names no server", false
	}
	out := make(map[int]bool, len(hosts))
	var last string // why nothing listens at the last server left out
	for _, h := range hosts {
		hp := lease.NormalizeServer(h)
		port, err := strconv.Atoi(hp[strings.LastIndexByte(hp, ':')+1:])
		if err != nil {
			return nil, fmt.Sprintf("no port in %q", h), false
		}
		pid, why, err := procs.ListeningServer(c.procRoot, port)
		if err != nil {
			return nil, fmt.Sprintf("process table: %v", err), false
		}
		nothing := strings.HasPrefix(why, procs.NothingListens)
		switch {
		case pid == 0 && nothing && len(hosts) > 1:
			last = why
			continue
		case pid == 0:
			return nil, why, nothing
		}
		out[pid] = true
	}
	if len(out) == 0 {
		return nil, last, true
	}
	return out, "", false
}

// watchRunners prepares the process check of an unload of model, or says
// why there is none. again reports a failure worth retrying: the server is
// local but its /api/show failed (a reset, a restart, a 500), so the check
// is still to be made, and the unload may not be verified without it.
func (c *OllamaClient) watchRunners(ctx context.Context, model string) (w *runnerWatch, why string, again bool) {
	hosts := c.serverHosts()
	for _, h := range hosts {
		if !isLocalHost(h) {
			if h != "" {
				return nil, "remote server " + h, false
			}
			return nil, "remote server", false
		}
	}
	path, blob, err := c.modelWeights(ctx, model)
	if err != nil {
		return nil, fmt.Sprintf("model blob: %v", err), classify(err) != KindNotFound
	}
	if blob == "" {
		return nil, "model blob: the model has no weights file of its own", false
	}
	// A runner check that cannot see the server at the client's address
	// cannot see its runners either: it would prove nothing.
	servers, why, again := c.servingServers(hosts)
	if servers == nil {
		return nil, why, again
	}
	w = &runnerWatch{root: c.procRoot, blob: blob, servers: servers}
	// Several servers may keep the same weights in folders of their own.
	if filepath.IsAbs(path) && len(hosts) == 1 {
		w.path = filepath.Clean(path)
	}
	return w, "", false
}

// live counts the runners serving the model's weights whose parent is the
// server at the client's address (an orphan of a dead server, a runner
// whose parent cannot be checked, or one of another server on this
// machine is no load in progress that an unload could reach). When the
// server names its weights file by absolute path, a runner of another
// path does not count either.
func (w *runnerWatch) live() (int, error) {
	rs, err := procs.RunnersFor(w.root, w.blob)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, r := range rs {
		if r.ServerPID == 0 || !w.servers[r.ServerPID] {
			continue
		}
		if w.path != "" && filepath.IsAbs(r.ModelPath) && filepath.Clean(r.ModelPath) != w.path {
			continue
		}
		n++
	}
	return n, nil
}
