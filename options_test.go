package vramguard

import (
	"testing"
)

// DefaultOptions reports what NewClient takes for zero fields.
func TestDefaultOptionsAreNewClients(t *testing.T) {
	c, err := NewClient(Options{Getenv: func(string) string { return "" }})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d := DefaultOptions()
	got := c.opts
	if got.Timeouts != d.Timeouts || got.UnloadTimeout != d.UnloadTimeout || got.PollInterval != d.PollInterval ||
		got.VRAMPollInterval != d.VRAMPollInterval || got.CleanupTimeout != d.CleanupTimeout || got.LoadThreshold != d.LoadThreshold {
		t.Errorf("NewClient uses %+v, DefaultOptions says %+v", got, d)
	}
	if c.host != d.Host {
		t.Errorf("NewClient's host %q, DefaultOptions says %q", c.host, d.Host)
	}
	if d.Logger != nil || d.VRAM != nil || d.Budget != nil {
		t.Errorf("DefaultOptions sets more than the defaults: %+v", d)
	}
	if err := d.validate(); err != nil {
		t.Errorf("DefaultOptions does not validate: %v", err)
	}
}
