package vramprom_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
	"github.com/vramguard/vramguard/vramprom"
)

// A program's own registry, a client whose hooks feed the collector (next
// to a hook of the program's own), and a guarded generation: the load and
// the guard's verified unload are counted.
func Example() {
	s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "llama3.2", Size: 2 << 30, LoadLatency: 20 * time.Millisecond}}})
	defer s.Close()

	col, err := vramprom.New(vramprom.Config{})
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	mine := vramguard.Hooks{OnCallEnd: func(_ context.Context, e vramguard.CallEnd) {
		if e.Generation != nil && e.Generation.Loaded {
			fmt.Println("loaded", e.Model)
		}
	}}
	client, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), Hooks: vramguard.JoinHooks(mine, col.Hooks())})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	g := vramguard.Guard{Client: client}
	if _, err := g.Generate(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "hi"}, nil); err != nil {
		log.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "vramguard_model_") || !strings.HasSuffix(mf.GetName(), "_total") {
			continue
		}
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				if l.GetName() != "server" { // the fake's port changes from run to run
					ls = append(ls, l.GetName()+"="+l.GetValue())
				}
			}
			fmt.Println(mf.GetName(), strings.Join(ls, " "), m.GetCounter().GetValue())
		}
	}
	// Output:
	// loaded llama3.2
	// vramguard_model_loads_total model=llama3.2:latest reload_cause=none 1
	// vramguard_model_unloads_total cause=guard model=llama3.2:latest outcome=verified 1
}

// Serving /metrics: the watched server's resident models and the device's
// memory by holder are read at each scrape.
func ExampleCollector_Watch() {
	s := vramguardtest.New(vramguardtest.Config{TotalVRAM: 8 << 30, Models: []vramguardtest.ModelConfig{{Name: "llama3.2", Size: 2 << 30}}})
	defer s.Close()

	col, err := vramprom.New(vramprom.Config{VRAM: s.GPU()})
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	client, err := vramguard.NewClient(vramguard.Options{Host: s.URL().String(), Hooks: col.Hooks()})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	stop := col.Watch(client)
	defer stop()
	metrics := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer metrics.Close()

	if _, err := client.GenerateStreaming(context.Background(), &vramguard.GenerateRequest{Model: "llama3.2", Prompt: "hi"}, vramguard.KeepAliveFor(time.Hour), nil); err != nil {
		log.Fatal(err)
	}
	resp, err := http.Get(metrics.URL)
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	var lines []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		l := strings.ReplaceAll(sc.Text(), s.URL().Host, "HOST")
		if strings.HasPrefix(l, "vramguard_model_resident") || strings.HasPrefix(l, "vramguard_device_memory_bytes") {
			lines = append(lines, l)
		}
	}
	sort.Strings(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// vramguard_device_memory_bytes{device="0",holder="",kind="free"} 6.442450944e+09
	// vramguard_device_memory_bytes{device="0",holder="llama3.2:latest",kind="runner"} 2.147483648e+09
	// vramguard_model_resident{model="llama3.2:latest",server="HOST"} 1
}
