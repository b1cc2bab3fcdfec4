package probe_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/probe"
	"github.com/vramguard/vramguard/vramguardtest"
)

// Serving /ready (and /metrics) for a server and its GPU, here the test
// double's: a model not loaded, then loaded, then more memory asked for
// than the device has free.
func Example() {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 8 << 30, Models: []vramguardtest.ModelConfig{{Name: "llama3.2", Size: 2 << 30}}})
	defer s.Close()
	client, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String()})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	// The double's runners are no processes: an empty procfs root keeps
	// this machine's own out of the answers.
	procfs, err := os.MkdirTemp("", "procfs")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(procfs)

	h, err := probe.New(probe.Config{Client: client, VRAM: s.GPU(), ProcRoot: procfs})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	srv := httptest.NewServer(h) // a program: http.Server{Handler: h}
	defer srv.Close()

	ready := func(query string) {
		resp, err := http.Get(srv.URL + "/ready?" + query)
		if err != nil {
			log.Fatal(err)
		}
		defer resp.Body.Close()
		var r probe.Readiness
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			log.Fatal(err)
		}
		fmt.Println(resp.StatusCode, r.Ready, r.Reasons)
	}
	ready("model=llama3.2")
	if _, err := client.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "hi"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		log.Fatal(err)
	}
	ready("model=llama3.2")
	ready(fmt.Sprintf("free=%d", 7<<30))
	// Output:
	// 503 false [/api/ps does not list llama3.2:latest]
	// 200 true []
	// 503 false [device 0 has 6.0 GiB free of 8.0 GiB, 7.0 GiB needed; held by: runner llama3.2:latest (2.0 GiB)]
}

// A program's own use of the readiness /ready answers: a proxy that asks
// before it forwards.
func ExampleHandler_Ready() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "llama3.2", Size: 2 << 30}}})
	defer s.Close()
	client, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String()})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	h, err := probe.New(probe.Config{Client: client})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()

	r := h.Ready(context.Background(), probe.Query{})
	fmt.Println("server:", r.Ready)
	r = h.Ready(context.Background(), probe.Query{Model: "llama3.2"})
	fmt.Println("llama3.2:", r.Model.State, r.Ready)
	r = h.Ready(context.Background(), probe.Query{Free: 1 << 30, HasFree: true})
	fmt.Println(r.Reasons[0])
	// Output:
	// server: true
	// llama3.2: absent false
	// no GPU reader: device memory not measured
}

// The Handler's collector counts the calls of the program's own clients
// when they carry its hooks.
func ExampleHandler_Metrics() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "llama3.2", Size: 2 << 30}}})
	defer s.Close()
	watched, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String()})
	if err != nil {
		log.Fatal(err)
	}
	defer watched.Close()
	h, err := probe.New(probe.Config{Client: watched})
	if err != nil {
		log.Fatal(err)
	}
	defer h.Close()
	client, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), Hooks: h.Metrics().Hooks()})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	srv := httptest.NewServer(h)
	defer srv.Close()

	if _, err := client.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "hi"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		log.Fatal(err)
	}
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := strings.ReplaceAll(sc.Text(), s.URL().Host, "HOST")
		if strings.HasPrefix(l, "vramguard_model_loads_total") || strings.HasPrefix(l, "vramguard_model_resident") {
			fmt.Println(l)
		}
	}
	// Output:
	// vramguard_model_loads_total{model="llama3.2:latest",reload_cause="none",server="HOST"} 1
	// vramguard_model_resident{model="llama3.2:latest",server="HOST"} 1
}

// ParseQuery reads /ready's query; its errors are KindInvalidInput, their
// cause the message /ready answers with.
func ExampleParseQuery() {
	q, err := probe.ParseQuery(url.Values{"model": {"llama3.2"}, "free": {"4294967296"}})
	fmt.Printf("%+v %v\n", q, err)
	_, err = probe.ParseQuery(url.Values{"free": {"4GiB"}})
	fmt.Println(errors.Is(err, vramguard.KindInvalidInput), errors.Unwrap(err))
	// Output:
	// {Model:llama3.2 Free:4294967296 HasFree:true Device:0 HasDevice:false} <nil>
	// true free="4GiB": want a number of bytes
}
