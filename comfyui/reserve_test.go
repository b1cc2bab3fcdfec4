package comfyui_test

import (
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/comfyui"
	"github.com/vramguard/vramguard/comfyuitest"
	"github.com/vramguard/vramguard/vramguardtest"
)

// The exclusive hand-off the other way: ComfyUI's Free, asked to, reserves
// what it measurably gave back for an LLM load. Another program's budget
// load that needs those bytes is refused naming the reservation; the
// holder's own load uses them; after the release the other is admitted.
func TestFreeReservesForTheLLM(t *testing.T) {
	p := newPair(t, comfyuitest.Config{}, vramguardtest.ModelConfig{Name: "llm", SizeVRAM: 9 * gib}, vramguardtest.ModelConfig{Name: "small", SizeVRAM: gib})
	c := p.client(t, p.ollama.GPU())
	if _, err := c.Run(t.Context(), workflow(2, nil)); err != nil {
		t.Fatal(err)
	}
	leases := vramguard.LeaseOptions{Dir: filepath.Join(t.TempDir(), "leases")}
	newClient := func() *vramguard.OllamaClient {
		return vramguardtest.NewClient(t, p.ollama, vramguard.Options{VRAM: c.Reader(p.ollama.GPU()), Leases: leases, Budget: &vramguard.Budget{},
			Timeouts: vramguard.Timeouts{FirstChunk: 20 * time.Second}})
	}
	holder, other := newClient(), newClient()
	held := p.comfy.Held().Total()
	rc, err := c.Free(t.Context(), comfyui.FreeRequest{Wait: true, Reserve: &comfyui.FreeReservation{Client: holder,
		ReserveOptions: vramguard.ReserveOptions{For: "LLM load", TTL: time.Minute}}})
	if err != nil || rc.Outcome != comfyui.OutcomeFreed || rc.Reservation == nil {
		t.Fatalf("Free = %v, %v; want freed and reserved (not checked: %q)", rc, err, rc.NotChecked)
	}
	if info := rc.Reservation.Info(); info.Bytes != rc.Released() || info.Bytes == 0 || info.Bytes > held || info.For != "LLM load" {
		t.Fatalf("reservation %+v; want what the receipt measured coming back (%d of the %d ComfyUI held)", info, rc.Released(), held)
	}
	_, err = other.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "llm", Prompt: "x"}, vramguard.KeepAliveUnload, nil)
	var re *vramguard.RoomError
	if !errors.As(err, &re) || len(re.Reserved) != 1 || re.Reserved[0].For != "LLM load" || p.ollama.Loads("llm") != 0 {
		t.Fatalf("another program's load into the freed room: %v; want refused naming the reservation", err)
	}
	if _, err := holder.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "llm", Prompt: "x"}, vramguard.KeepAliveUnload, nil); err != nil {
		t.Fatalf("the holder's own load into its reservation: %v", err)
	}
	if err := rc.Reservation.Release(); err != nil {
		t.Fatal(err)
	}
	if _, err := other.GenerateStreaming(t.Context(), &vramguard.GenerateRequest{Model: "llm", Prompt: "x"}, vramguard.KeepAliveUnload, nil); err != nil {
		t.Fatalf("the other's load after the release: %v", err)
	}
}

// A free that gives nothing back reserves nothing and says why; a
// reservation without a holder is refused before anything is sent.
func TestFreeReservesOnlyWhatCameBack(t *testing.T) {
	p := newPair(t, comfyuitest.Config{})
	c := p.client(t, p.ollama.GPU())
	holder := vramguardtest.NewClient(t, p.ollama, vramguard.Options{VRAM: p.ollama.GPU(), Leases: vramguard.LeaseOptions{Dir: filepath.Join(t.TempDir(), "leases")}})
	rc, err := c.Free(t.Context(), comfyui.FreeRequest{Quiet: 200 * time.Millisecond, Reserve: &comfyui.FreeReservation{Client: holder}})
	if err != nil || rc.Reservation != nil || !slices.ContainsFunc(rc.NotChecked, func(s string) bool { return strings.HasPrefix(s, "reservation: nothing") }) {
		t.Fatalf("free of an idle ComfyUI holding nothing: %v, %v; want no reservation, said so", rc, err)
	}
	if _, err := c.Free(t.Context(), comfyui.FreeRequest{Reserve: &comfyui.FreeReservation{}}); !errors.Is(err, vramguard.KindInvalidInput) {
		t.Fatalf("Reserve without a Client: %v, want KindInvalidInput", err)
	}
}

// FreeReservation.Bytes caps the reservation below what came back; a
// reservation the library refuses (here one naming a Model, which a
// reservation of room cannot) is named in NotChecked while the free's
// outcome stands, and nothing is reserved.
func TestFreeReservationCappedOrRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		fr   comfyui.FreeReservation
	}{
		{"capped", comfyui.FreeReservation{ReserveOptions: vramguard.ReserveOptions{For: "LLM load"}, Bytes: 1 << 20}},
		{"refused", comfyui.FreeReservation{ReserveOptions: vramguard.ReserveOptions{For: "LLM load", Model: "llm"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPair(t, comfyuitest.Config{})
			c := p.client(t, p.ollama.GPU())
			if _, err := c.Run(t.Context(), workflow(2, nil)); err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(t.TempDir(), "leases")
			tc.fr.Client = vramguardtest.NewClient(t, p.ollama, vramguard.Options{VRAM: p.ollama.GPU(), Leases: vramguard.LeaseOptions{Dir: dir}})
			rc, err := c.Free(t.Context(), comfyui.FreeRequest{Wait: true, Reserve: &tc.fr})
			if err != nil || rc.Outcome != comfyui.OutcomeFreed || rc.Released() <= 1<<20 {
				t.Fatalf("Free = %v, %v; want freed, more than 1 MiB back", rc, err)
			}
			files, _ := filepath.Glob(filepath.Join(dir, "*.reserve"))
			if tc.fr.Model == "" {
				if rc.Reservation == nil || rc.Reservation.Info().Bytes != 1<<20 || len(files) != 1 {
					t.Fatalf("capped: reservation %v, %d files; want 1 MiB of the %d back", rc.Reservation, len(files), rc.Released())
				}
				return
			}
			if rc.Reservation != nil || len(files) != 0 || !slices.ContainsFunc(rc.NotChecked, func(s string) bool { return strings.HasPrefix(s, "reservation: ") }) {
				t.Fatalf("refused: reservation %v, %d files, not checked %q; want none, said so", rc.Reservation, len(files), rc.NotChecked)
			}
		})
	}
}
