package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ollama/ollama/api"
	"go.uber.org/goleak"

	"github.com/vramguard/vramguard/gpu"
	"github.com/vramguard/vramguard/vramguardtest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// deadHost returns an address where nothing listens, so the pipeline falls
// back to the simulator whatever runs on this machine.
func deadHost(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// svgShape is what the test reads back from the picture.
type svgShape struct {
	XMLName   xml.Name `xml:"svg"`
	Polylines []struct {
		Class  string `xml:"class,attr"`
		Points string `xml:"points,attr"`
	} `xml:"polyline"`
	Rects []struct {
		Class string `xml:"class,attr"`
		Step  string `xml:"data-step,attr"`
	} `xml:"rect"`
	Circles []struct {
		Class string `xml:"class,attr"`
		Kind  string `xml:"data-kind,attr"`
	} `xml:"circle"`
}

func runPipeline(t *testing.T, mode string) (out string, shape svgShape, err error) {
	t.Helper()
	svg := filepath.Join(t.TempDir(), "p.svg")
	var stdout, stderr bytes.Buffer
	err = run(t.Context(), []string{"-host", deadHost(t), "-probe", "200ms", "-mode", mode, "-out", svg}, &stdout, &stderr)
	f, ferr := os.Open(svg)
	if ferr != nil {
		t.Fatalf("no SVG written: %v (stdout %s)", ferr, stdout.String())
	}
	defer f.Close()
	data, _ := io.ReadAll(f)
	if xerr := xml.Unmarshal(data, &shape); xerr != nil {
		t.Fatalf("SVG is not well-formed: %v", xerr)
	}
	return stdout.String(), shape, err
}

// rows returns the timeline rows whose step starts with name.
func rows(out, name string) []string {
	var rs []string
	for _, l := range strings.Split(out, "\n") {
		f := strings.Fields(l)
		if len(f) > 1 && strings.HasSuffix(f[0], "s") && strings.HasPrefix(strings.Join(f[1:], " "), name) {
			rs = append(rs, l)
		}
	}
	return rs
}

func TestPipelineModes(t *testing.T) {
	tests := []struct {
		mode      string
		loads     string
		fails     bool
		residentB string // the resident column before the encoder load
	}{
		{mode: "phase", loads: "loads: 2;"},
		{mode: "per-call", loads: "loads: 5;"},
		{mode: "naive", loads: "loads: 2;", fails: true},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			out, shape, err := runPipeline(t, tt.mode)
			first, _, _ := strings.Cut(out, "\n")
			if !strings.Contains(first, "simulator") {
				t.Errorf("first line does not say it used the simulator: %q", first)
			}
			if !strings.Contains(out, tt.loads) {
				t.Errorf("want %q in:\n%s", tt.loads, out)
			}
			for _, step := range []string{"start", "generate prompt", "refine ×3", "negative prompt", "hand over VRAM", "load text encoder"} {
				if len(rows(out, step)) == 0 {
					t.Errorf("no timeline row for %q:\n%s", step, out)
				}
			}
			hand := rows(out, "hand over VRAM")
			enc := rows(out, "load text encoder")
			if tt.fails {
				if err == nil || !strings.Contains(err.Error(), "VRAM grow failed") {
					t.Fatalf("naive mode: got %v, want the original OOM", err)
				}
				if !strings.Contains(enc[0], "FAILED") || !strings.Contains(hand[0], "qwen3:8b") {
					t.Errorf("naive rows:\n%s\n%s", hand[0], enc[0])
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// Zero models resident before the encoder load.
			if f := strings.Fields(hand[0]); len(f) < 6 || f[4] != "-" {
				t.Errorf("models resident before the encoder load: %q", hand[0])
			}
			if !strings.Contains(enc[0], "11.2 GB loaded") {
				t.Errorf("encoder row %q", enc[0])
			}
			// The picture: a line for the device with samples, a band per
			// step, load and verified-eviction markers.
			if len(shape.Polylines) != 1 || shape.Polylines[0].Class != "device" || len(strings.Fields(shape.Polylines[0].Points)) < 10 {
				t.Errorf("device series: %+v", shape.Polylines)
			}
			steps := map[string]bool{}
			for _, r := range shape.Rects {
				if r.Class == "step" {
					steps[r.Step] = true
				}
			}
			for _, s := range []string{"generate prompt", "refine ×3", "negative prompt", "hand over VRAM", "load text encoder"} {
				if !steps[s] {
					t.Errorf("no band for %q", s)
				}
			}
			kinds := map[string]int{}
			for _, c := range shape.Circles {
				if c.Class == "event" {
					kinds[c.Kind]++
				}
			}
			if kinds["load"] == 0 || kinds["eviction verified"] == 0 || kinds["admitted"] == 0 {
				t.Errorf("markers %v", kinds)
			}
		})
	}
}

func TestPipelineUsage(t *testing.T) {
	for _, args := range [][]string{{"-mode", "fast"}, {"-bytes", "0"}, {"-nope"}} {
		err := run(t.Context(), args, io.Discard, io.Discard)
		if !errors.Is(err, errUsage) {
			t.Errorf("%v: got %v, want a usage error", args, err)
		}
	}
}

// TestPipelineWithoutGPUReader: against a server that answers, on a
// machine without a GPU reader, the pipeline neither fails its hand-over
// nor unloads another program's model.
func TestPipelineWithoutGPUReader(t *testing.T) {
	if r, err := gpu.NewAutoReader(t.Context(), gpu.ReaderOptions{}); err == nil {
		r.Close()
		t.Skipf("this machine has a GPU reader (%s)", r.Source())
	}
	for _, mode := range []string{"phase", "per-call"} {
		t.Run(mode, func(t *testing.T) {
			s := vramguardtest.New(vramguardtest.Config{Models: []vramguardtest.ModelConfig{{Name: "gen"}, {Name: "ref"}, {Name: "theirs"}}})
			defer s.Close()
			forever := &api.Duration{Duration: -1}
			if err := s.APIClient().Generate(t.Context(), &api.GenerateRequest{Model: "theirs", Prompt: "x", KeepAlive: forever},
				func(api.GenerateResponse) error { return nil }); err != nil {
				t.Fatal(err)
			}
			var stdout bytes.Buffer
			err := run(t.Context(), []string{"-host", s.URL().String(), "-mode", mode, "-gen-model", "gen", "-model", "ref",
				"-out", filepath.Join(t.TempDir(), "p.svg")}, &stdout, io.Discard)
			if err != nil {
				t.Fatalf("%v\n%s", err, stdout.String())
			}
			first, _, _ := strings.Cut(stdout.String(), "\n")
			if !strings.Contains(first, "no GPU reader") {
				t.Errorf("first line %q", first)
			}
			// No device reader: memory is "not measured", the encoder's
			// room "not checked", never a made-up figure.
			for _, r := range rows(stdout.String(), "") {
				if !strings.Contains(r, "not measured") || strings.Contains(r, " GB") {
					t.Errorf("row without a reader: %q", r)
				}
			}
			if r := rows(stdout.String(), "load text encoder"); len(r) != 1 || !strings.Contains(r[0], "not checked") || strings.Contains(r[0], "loaded") {
				t.Errorf("encoder row %q, want 'not checked'", r)
			}
			if s.Listed("gen") || s.Listed("ref") || !s.Listed("theirs") {
				t.Errorf("listed: gen %v, ref %v, theirs %v; want only theirs", s.Listed("gen"), s.Listed("ref"), s.Listed("theirs"))
			}
		})
	}
}

func TestPipelineHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"-help"}, {"--help"}, {"-mode", "phase", "-h"}} {
		var stdout, stderr bytes.Buffer
		err := run(t.Context(), args, &stdout, &stderr)
		if !errors.Is(err, flag.ErrHelp) || exitCode(err) != 0 {
			t.Errorf("%v: %v (exit %d), want the help and exit 0", args, err, exitCode(err))
		}
		if !strings.Contains(stderr.String(), "-mode string") || stdout.Len() != 0 {
			t.Errorf("%v: stdout %q, stderr %q; want the usage on stderr only", args, stdout.String(), stderr.String())
		}
	}
	if err := run(t.Context(), []string{"-nope"}, io.Discard, io.Discard); exitCode(err) != 2 {
		t.Errorf("a bad flag: exit %d, want 2", exitCode(err))
	}
	if exitCode(errors.New("boom")) != 1 || exitCode(nil) != 0 {
		t.Error("exit codes of a failure and a success")
	}
}

// TestPipelineSaysWhy: in phase mode the budget evicts the generator's
// model to admit the refiner's (24 GiB, the UNet's 7.5 GB and 11.2 GB kept
// for the encoder), and the timeline says so where it happens; the
// hand-over names what it unloaded and what had left already.
func TestPipelineSaysWhy(t *testing.T) {
	out, _, err := runPipeline(t, "phase")
	if err != nil {
		t.Fatal(err)
	}
	if r := rows(out, "refine ×3"); len(r) != 1 || !strings.HasSuffix(r[0], "budget made room: unloaded qwen3:8b") {
		t.Errorf("refine row %q, want the budget's eviction named", r)
	}
	if r := rows(out, "hand over VRAM"); len(r) != 1 || !strings.Contains(r[0], "verified unload of llama3.2:3b (qwen3:8b had left already)") {
		t.Errorf("hand-over row %q", r)
	}
	if !strings.Contains(out, "loads: 2; evicted by the budget: 1;") {
		t.Errorf("summary line missing the eviction:\n%s", out)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.HasSuffix(l, " ") {
			t.Errorf("trailing blanks: %q", l)
		}
	}
}
