package vramotel

// The attributes the hooks share between calls, made once.

import (
	"net/url"
	"slices"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/vramguard/vramguard"
)

// attrCache holds the attributes of each server and of each operation,
// model and server, so that a call's hooks build none (attribute sets
// are most of an instrumented call's cost). Its zero value is empty and
// ready; it is safe for concurrent use.
type attrCache struct {
	mu      sync.RWMutex
	servers map[string][]attribute.KeyValue
	calls   map[callAttrsKey]*callAttrs
}

// callAttrs is what the calls of one operation, model and server share:
// the span's name and start options, and the metrics' attributes, made
// once, as measurement options, so that a call's hooks build none.
type callAttrs struct {
	name        string
	kind, attrs trace.SpanStartOption
	kv          []attribute.KeyValue // the metrics': operation, provider, model, server
	model       []attribute.KeyValue // the metrics' model and server
	ok          []metric.RecordOption
	input       []metric.RecordOption
	output      []metric.RecordOption
}

type callAttrsKey struct{ op, model, server string }

// maxCallAttrs bounds the cache of callAttrs: a program that names
// thousands of models (or servers) makes the rest afresh at each call.
const maxCallAttrs = 256

// call returns the callAttrs of cs's operation, model and server.
func (c *attrCache) call(cs vramguard.CallStart) *callAttrs {
	key := callAttrsKey{cs.Op, cs.Model, cs.Server}
	c.mu.RLock()
	a, ok := c.calls[key]
	c.mu.RUnlock()
	if ok {
		return a
	}
	op := operation(cs.Op)
	srv := c.server(cs.Server)
	kv := []attribute.KeyValue{
		attribute.String(AttrOperationName, op),
		attribute.String(AttrProviderName, ProviderOllama),
		attribute.String(AttrRequestModel, cs.Model),
	}
	kv = append(kv, srv...)
	mkv := slices.Clone(kv)
	mkv[2] = metricModel(cs.Model)
	opts := func(extra ...attribute.KeyValue) []metric.RecordOption {
		set := attribute.NewSet(append(slices.Clip(mkv), extra...)...)
		return []metric.RecordOption{metric.WithAttributeSet(set)}
	}
	a = &callAttrs{
		name:   op + " " + cs.Model,
		kind:   trace.WithSpanKind(trace.SpanKindClient),
		attrs:  trace.WithAttributes(kv...),
		kv:     mkv,
		model:  append([]attribute.KeyValue{mkv[2]}, srv...),
		ok:     opts(),
		input:  opts(attribute.String(AttrTokenType, TokenTypeInput)),
		output: opts(attribute.String(AttrTokenType, TokenTypeOutput)),
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.calls == nil {
		c.calls = make(map[callAttrsKey]*callAttrs)
	}
	if len(c.calls) < maxCallAttrs {
		c.calls[key] = a
	}
	return a
}

// server returns server.address and server.port for a client's
// server URL ("http://127.0.0.1:11434"; without a port, Ollama's 11434, or
// 443 for https); none when it is empty or does not parse. The result is shared: callers must not modify it.
func (c *attrCache) server(server string) []attribute.KeyValue {
	if server == "" {
		return nil
	}
	c.mu.RLock()
	kv, ok := c.servers[server]
	c.mu.RUnlock()
	if ok {
		return kv
	}
	if u, err := url.Parse(server); err == nil && u.Hostname() != "" {
		kv = append(kv, attribute.String(AttrServerAddress, u.Hostname()))
		port, err := strconv.Atoi(u.Port())
		if err != nil { // none: Ollama's
			port = 11434
			if u.Scheme == "https" {
				port = 443
			}
		}
		kv = append(kv, attribute.Int(AttrServerPort, port))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.servers == nil {
		c.servers = make(map[string][]attribute.KeyValue)
	}
	if len(c.servers) < maxCallAttrs {
		c.servers[server] = kv
	}
	return kv
}
