// Command observe wires a vramguard client to OpenTelemetry and
// Prometheus: one guarded generation, traced (each span printed as it
// ends) and counted, then, with -listen, /metrics served until
// interrupted. Put your own exporter (OTLP, ...) where the printer is.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramotel"
	"github.com/vramguard/vramguard/vramprom"
)

func main() {
	listen := flag.String("listen", "", "serve /metrics at this host:port until interrupted")
	model := flag.String("model", "llama3.2", "the model to generate with")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// Traces: the span printer stands for your exporter.
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(printer{}))
	defer tp.Shutdown(context.Background())
	inst, err := vramotel.New(vramotel.Config{TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}
	defer inst.Close()

	// Metrics: a collector on a registry of the program's own.
	col, err := vramprom.New(vramprom.Config{})
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)

	// OLLAMA_HOST, or 127.0.0.1:11434.
	c, err := vramguard.NewClient(vramguard.Options{Hooks: vramguard.JoinHooks(inst.Hooks(), col.Hooks())})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	defer col.Watch(c)() // resident models, read at each scrape

	g := vramguard.Guard{Client: c} // unloads the model after use, verified
	gen, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: *model, Prompt: "a castle at dawn, in one line"}, nil)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(gen.Text)

	if *listen == "" {
		return
	}
	srv := &http.Server{Addr: *listen, Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{})}
	go func() {
		<-ctx.Done()
		_ = srv.Shutdown(context.Background())
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		log.Fatal(err)
	}
}

// printer prints each span as it ends, on stderr.
type printer struct{}

func (printer) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	for _, s := range spans {
		fmt.Fprintf(os.Stderr, "span %q %v\n", s.Name(), s.EndTime().Sub(s.StartTime()).Round(time.Millisecond))
	}
	return nil
}

func (printer) Shutdown(context.Context) error { return nil }
