package vramotel_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
	"github.com/vramguard/vramguard/vramotel"
)

// A guarded generation on the fake Ollama, traced: the call's span, the
// load under it, and the guard's unload after it. A real program passes
// its exporter's TracerProvider (or none: the global one).
func Example() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "llama3.2", LoadLatency: 20 * time.Millisecond}}})
	defer s.Close()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())

	inst, err := vramotel.New(vramotel.Config{TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}
	defer inst.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), Hooks: inst.Hooks()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	g := vramguard.Guard{Client: c} // unloads the model after use, verified
	if _, err := g.Generate(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "a castle at dawn"}, nil); err != nil {
		log.Fatal(err)
	}
	names := map[trace.SpanID]string{}
	for _, sp := range spans.GetSpans() {
		names[sp.SpanContext.SpanID()] = sp.Name
	}
	for _, sp := range spans.GetSpans() { // in the order they ended
		if parent, ok := names[sp.Parent.SpanID()]; ok {
			fmt.Printf("%s (in %s)\n", sp.Name, parent)
		} else {
			fmt.Println(sp.Name)
		}
	}
	// Output:
	// load llama3.2 (in text_completion llama3.2)
	// text_completion llama3.2
	// unload llama3.2
}

// Watch reports, at each collection, the models the client's server
// holds; Config.VRAM the device's memory by holder.
func ExampleInstrumentation_Watch() {
	const gib = 1 << 30
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 8 * gib, Models: []vramguardtest.ModelConfig{{Name: "llama3.2", Size: 2 * gib}}})
	defer s.Close()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	inst, err := vramotel.New(vramotel.Config{MeterProvider: mp, VRAM: s.GPU()})
	if err != nil {
		log.Fatal(err)
	}
	defer inst.Close()
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), Hooks: inst.Hooks()})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	defer inst.Watch(c)() // stop watching before the client closes

	ctx := context.Background()
	if _, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "hi"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		log.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		log.Fatal(err)
	}
	for _, m := range rm.ScopeMetrics[0].Metrics {
		g, ok := m.Data.(metricdata.Gauge[int64])
		if !ok {
			continue
		}
		for _, p := range g.DataPoints {
			model, _ := p.Attributes.Value(vramotel.AttrRequestModel)
			holder, _ := p.Attributes.Value(vramotel.AttrMemoryHolderKind)
			v := fmt.Sprint(p.Value)
			if m.Unit == "By" {
				v = fmt.Sprint(p.Value/gib, " GiB")
			}
			fmt.Println(m.Name, model.String()+holder.String(), v)
		}
	}
	// Unordered output:
	// vramguard.model.resident llama3.2:latest 1
	// vramguard.model.vram llama3.2:latest 2 GiB
	// vramguard.device.memory runner 2 GiB
	// vramguard.device.memory free 6 GiB
}

// The hooks joined with a program's own: each sees the context its own
// start hook returned, and a hook after vramotel's finds the call's span
// in it, here to add an attribute of its own.
func ExampleInstrumentation_Hooks() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "llama3.2"}}})
	defer s.Close()
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	defer tp.Shutdown(context.Background())
	inst, err := vramotel.New(vramotel.Config{TracerProvider: tp})
	if err != nil {
		log.Fatal(err)
	}
	defer inst.Close()

	mine := vramguard.Hooks{
		OnCallStart: func(ctx context.Context, cs vramguard.CallStart) context.Context {
			trace.SpanFromContext(ctx).SetAttributes(attribute.String("app.pipeline.step", "prompt"))
			return ctx
		},
		OnCallEnd: func(ctx context.Context, ce vramguard.CallEnd) {
			fmt.Println(ce.Op, ce.Model, "ended, error:", ce.Err)
		},
	}
	c, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), Hooks: vramguard.JoinHooks(inst.Hooks(), mine)})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	if _, err := c.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "hi"}, vramguard.KeepAliveUnload, nil); err != nil {
		log.Fatal(err)
	}
	for _, sp := range spans.GetSpans() {
		for _, kv := range sp.Attributes {
			if kv.Key == "app.pipeline.step" || kv.Key == vramotel.AttrOperationName {
				fmt.Printf("%s: %s=%s\n", sp.Name, kv.Key, kv.Value.String())
			}
		}
	}
	// Output:
	// generate llama3.2 ended, error: <nil>
	// text_completion llama3.2: gen_ai.operation.name=text_completion
	// text_completion llama3.2: app.pipeline.step=prompt
}
