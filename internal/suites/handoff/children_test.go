//go:build linux

package handoff_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/vramguard/vramguard"
)

// The environment of the programs the test starts from its own binary.
const (
	roleEnv = "VRAMGUARD_HANDOFF_ROLE" // "orchestrator" or "second"
	specEnv = "VRAMGUARD_HANDOFF_SPEC" // a childSpec, JSON
	smiEnv  = "VRAMGUARD_HANDOFF_SMI"  // the device's URL, for the fake nvidia-smi the gate runs (testdata/fakesmi)
)

// childSpec is what a child program needs: the simulator, the device, the
// lease directory and its budget's MakeRoom.
type childSpec struct {
	Host     string `json:"host"`
	GPU      string `json:"gpu"`
	Dir      string `json:"dir"`
	MakeRoom bool   `json:"make_room"`
}

// remoteGPU reads the simulator's device from the test process, which
// serves its snapshots as JSON: every process on the host, the gate's
// fake nvidia-smi included, reads the same device (the same UUID, the
// render's allocation and the runners' memory as the simulator's ledger
// holds them).
type remoteGPU struct{ url string }

func (g remoteGPU) Snapshot(ctx context.Context) (*vramguard.VRAMSnapshot, error) {
	r, err := http.NewRequestWithContext(ctx, "GET", g.url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("device: %s", resp.Status)
	}
	var s vramguard.VRAMSnapshot
	if err := json.NewDecoder(resp.Body).Decode(&s); err != nil {
		return nil, err
	}
	return &s, nil
}

var _ vramguard.VRAMReader = remoteGPU{}

// childMain runs the orchestrator or the second program: it answers
// commands read from stdin, one line each, with a line "@ <answer>" on
// stdout, until stdin ends or it is killed.
//
//	load MODEL TAG KEEPALIVE_MS: a budget load (second): admitted,
//	  refused RESERVED (its *RoomError, naming RESERVED reservations),
//	  oom (a load admitted and then out of memory), error TEXT
//	handover BYTES: a phase that uses the model "phase" and hands BYTES
//	  over, reserved for "render" for an hour (orchestrator): reserved
//	  BYTES, refused TEXT, error TEXT
//	release: ends the hand-over's reservation: released
func childMain(role string) {
	var spec childSpec
	if err := json.Unmarshal([]byte(os.Getenv(specEnv)), &spec); err != nil {
		fmt.Println("@ error spec:", err)
		os.Exit(2)
	}
	opts := vramguard.Options{Host: spec.Host, VRAM: remoteGPU{spec.GPU}, Leases: vramguard.LeaseOptions{Dir: spec.Dir},
		PollInterval: 10 * time.Millisecond}
	if role == "second" {
		opts.Budget = &vramguard.Budget{MakeRoom: spec.MakeRoom}
	}
	c, err := vramguard.NewClient(opts)
	if err != nil {
		fmt.Println("@ error client:", err)
		os.Exit(2)
	}
	say := func(format string, args ...any) {
		fmt.Println("@ " + strings.Join(strings.Fields(fmt.Sprintf(format, args...)), " "))
	}
	say("ready")
	var res *vramguard.Lease
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		switch {
		case role == "second" && len(f) == 4 && f[0] == "load":
			ms, _ := strconv.Atoi(f[3])
			_, err := c.GenerateStreaming(ctx, &vramguard.GenerateRequest{Model: f[1], Prompt: f[2]},
				vramguard.KeepAliveFor(time.Duration(ms)*time.Millisecond), nil)
			var re *vramguard.RoomError
			switch {
			case err == nil:
				say("admitted")
			case errors.As(err, &re):
				say("refused %d", len(re.Reserved))
			case errors.Is(err, vramguard.KindOutOfMemory):
				say("oom %v", err)
			default:
				say("error %v", err)
			}
		case role == "orchestrator" && len(f) == 2 && f[0] == "handover":
			n, _ := strconv.ParseUint(f[1], 10, 64)
			rep, err := handover(ctx, c, n)
			switch {
			case err != nil && errors.Is(err, vramguard.KindOutOfMemory):
				say("refused %v", err)
			case err != nil:
				say("error %v", err)
			case rep.Handover == nil || rep.Handover.Reservation == nil:
				say("error the hand-over reserved nothing")
			default:
				res = rep.Handover.Reservation
				say("reserved %d", res.Info().Bytes)
			}
		case role == "orchestrator" && len(f) == 1 && f[0] == "release" && res != nil:
			if err := res.Release(); err != nil {
				say("error %v", err)
			} else {
				say("released")
			}
			res = nil
		default:
			say("error unknown command %q", sc.Text())
		}
		cancel()
	}
	_ = c.Close()
	os.Exit(0)
}

// handover runs a phase that generates with the model "phase" and hands
// n bytes over for the render, reserved (the default).
func handover(ctx context.Context, c *vramguard.OllamaClient, n uint64) (*vramguard.PhaseReport, error) {
	p, err := c.StartPhase(ctx, "prompts", vramguard.PhaseOptions{NeedBytes: n, Reserve: vramguard.ReserveOptions{For: "render", TTL: time.Hour}})
	if err != nil {
		return nil, err
	}
	g := p.Guard()
	if _, err := g.Generate(ctx, &vramguard.GenerateRequest{Model: "phase", Prompt: "prompts for the render"}, nil); err != nil {
		_, _ = p.End(ctx)
		return nil, err
	}
	return p.End(ctx)
}
