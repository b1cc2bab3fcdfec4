package main

// -listen: /metrics for Prometheus and /ready for probes, served by
// package probe.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/probe"
)

// shutdownTimeout bounds the wait for requests in flight once the
// server is asked to stop.
const shutdownTimeout = 5 * time.Second

// serve answers /metrics and /ready on addr until ctx is done (SIGINT,
// SIGTERM), then shuts the server down gracefully.
func (c *cmd) serve(ctx context.Context, w *watcher, addr string) error {
	h, err := probe.New(probe.Config{Client: w.ollama, VRAM: w.gpu, ProcRoot: w.procRoot, Timeout: w.timeout})
	if err != nil {
		return err
	}
	defer h.Close()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return &vramguard.Error{Op: "listen", Kind: vramguard.KindUnavailable, Err: err}
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(c.stderr, "vramwatch: serving http://%s/metrics and /ready\n", ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return &vramguard.Error{Op: "serve", Kind: vramguard.KindUnavailable, Err: err}
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	<-done // http.ErrServerClosed
	if err != nil {
		return &vramguard.Error{Op: "shutdown", Kind: vramguard.KindTimeout, Err: err}
	}
	return nil
}
