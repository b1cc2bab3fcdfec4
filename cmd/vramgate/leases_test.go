package main

import (
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/vramguard/vramguard"
	"github.com/vramguard/vramguard/vramguardtest"
)

// A lease taken over HTTP is held for its HTTP client (issue #47 item 4):
// another vramguard program sees the client's name on it (LeaseInfo.For,
// first in the refusal's text) and where the take came from, as the
// gate's own answer does; an extension moves the same lease's end for
// everyone; the gate's own unload is refused naming the client.
func TestHTTPLeaseNamesItsClient(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil, "-lease-max", "2m")
	other, err := vramguard.NewClient(vramguard.Options{Host: sim.URL().String(), Leases: vramguard.LeaseOptions{Dir: g.LeaseDir}})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	load(t, sim.APIClient(), "tiny")
	code, _, body := do(t, "POST", g.URL+"/vramgate/leases", `{"model":"tiny","holder":"render-box","ttl":"1m"}`)
	var l leaseAnswer
	if err := json.Unmarshal(body, &l); err != nil || code != 201 {
		t.Fatalf("take: %d %s", code, body)
	}
	if !strings.HasPrefix(l.Lease, "render-box via ") || !strings.Contains(l.Lease, "HTTP lease from 127.0.0.1:") {
		t.Errorf("the gate's answer says the lease is %q, want it held for render-box", l.Lease)
	}

	seen := func() vramguard.LeaseInfo {
		t.Helper()
		_, err := other.UnloadModel(t.Context(), "tiny")
		var le *vramguard.LeasedError
		if !errors.Is(err, vramguard.ErrLeased) || !errors.As(err, &le) || len(le.Leases) != 1 {
			t.Fatalf("another program's unload of the leased model: %v, want a *LeasedError", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "leased by render-box via ") {
			t.Errorf("refusal %q does not name the HTTP client first", msg)
		}
		return le.Leases[0]
	}
	info := seen()
	if info.For != "render-box" || !strings.HasPrefix(info.Note, "HTTP lease from 127.0.0.1:") || info.PID != os.Getpid() || info.Model != "tiny:latest" {
		t.Errorf("another program sees %+v, want the lease held for render-box", info)
	}
	if info.Until.Before(time.Now().Add(50*time.Second)) || info.Until.After(time.Now().Add(time.Minute)) {
		t.Errorf("until %v, want a minute from the take", info.Until)
	}

	code, _, body = do(t, "POST", g.URL+"/vramgate/leases/"+l.ID, `{"ttl":"2m"}`)
	if code != 200 {
		t.Fatalf("extend: %d %s", code, body)
	}
	if got := seen(); got.ID != info.ID || got.For != "render-box" || got.Until.Before(time.Now().Add(110*time.Second)) {
		t.Errorf("after the extension another program sees %+v, want lease %s ending two minutes from now", got, info.ID)
	}

	code, _, body = do(t, "POST", g.URL+"/api/generate", `{"model":"tiny","keep_alive":0}`)
	if code != 409 || !strings.Contains(string(body), "render-box via ") || !sim.Listed("tiny") {
		t.Fatalf("unload through the gate of the leased model: %d %s", code, body)
	}

	if code, _, body := do(t, "DELETE", g.URL+"/vramgate/leases/"+l.ID, ""); code != 200 {
		t.Fatalf("release: %d %s", code, body)
	}
	if rep, err := other.UnloadModel(t.Context(), "tiny"); err != nil || !rep.Verified {
		t.Fatalf("another program's unload after the release: %+v, %v", rep, err)
	}
}
