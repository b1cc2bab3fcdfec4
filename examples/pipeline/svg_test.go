package main

import (
	"encoding/xml"
	"strconv"
	"strings"
	"testing"
	"time"
)

// eventShape is what TestSVGNamesEventModels reads back: the event markers
// and the lanes' labels.
type eventShape struct {
	Circles []struct {
		Class string  `xml:"class,attr"`
		Kind  string  `xml:"data-kind,attr"`
		Model string  `xml:"data-model,attr"`
		CX    float64 `xml:"cx,attr"`
		CY    float64 `xml:"cy,attr"`
		Title string  `xml:"title"`
	} `xml:"circle"`
	Texts []struct {
		Class  string  `xml:"class,attr"`
		Model  string  `xml:"data-model,attr"`
		X      float64 `xml:"x,attr"`
		Y      float64 `xml:"y,attr"`
		Anchor string  `xml:"text-anchor,attr"`
		Text   string  `xml:",chardata"`
	} `xml:"text"`
}

func TestSVGNamesEventModels(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	r := &recorder{
		devices: []string{"GPU 0: Test"}, total: 24e9,
		samples: []sample{{at: 0, used: []uint64{7e9}}, {at: ms(2000), used: []uint64{9e9}}},
		events: []event{
			{at: ms(100), kind: "admitted", model: "qwen3:8b"},
			{at: ms(600), kind: "load", model: "qwen3:8b"},
			// Two models' events at the same instant, as a hand-over
			// of two models sends them.
			{at: ms(1500), kind: "unload requested", model: "llama3.2:3b"},
			{at: ms(1500), kind: "unload requested", model: "qwen3:8b"},
			{at: ms(1500), kind: "eviction verified", model: "llama3.2:3b"}, // at once: one row lower
			{at: ms(1502), kind: "unload requested", model: "llama3.2:3b"},  // and again
			{at: ms(1990), kind: "oom", model: "text encoder"},              // at the right edge
		},
	}
	var b strings.Builder
	if err := r.writeSVG(&b, "test"); err != nil {
		t.Fatal(err)
	}
	var shape eventShape
	if err := xml.Unmarshal([]byte(b.String()), &shape); err != nil {
		t.Fatalf("SVG is not well-formed: %v\n%s", err, b.String())
	}

	laneY := map[string]float64{} // model -> the y of its lane's own row
	type mark struct {
		model  string
		cx, cy float64
	}
	var marks []mark
	n := 0
	for _, c := range shape.Circles {
		if c.Class != "event" {
			continue
		}
		e := r.events[n]
		n++
		want := strconv.FormatFloat(e.at.Seconds(), 'f', 2, 64) + "s " + e.kind + " " + e.model
		if c.Model != e.model || c.Kind != e.kind || c.Title != want {
			t.Errorf("marker %d: model %q, kind %q, title %q; want %q, %q, %q", n, c.Model, c.Kind, c.Title, e.model, e.kind, want)
		}
		if _, ok := laneY[c.Model]; !ok {
			laneY[c.Model] = c.CY // its first marker is on the lane's row
		}
		if y := laneY[c.Model]; c.CY != y && c.CY != y+9 {
			t.Errorf("marker of %s at y %v, want its lane's rows, %v or %v", c.Model, c.CY, y, y+9)
		}
		marks = append(marks, mark{c.Model, c.CX, c.CY})
	}
	// Markers of one model at once do not cover each other.
	for i, a := range marks {
		for _, b := range marks[:i] {
			if dx, dy := a.cx-b.cx, a.cy-b.cy; dx*dx+dy*dy < 8*8 {
				t.Errorf("markers of %s at (%v, %v) and of %s at (%v, %v) overlap", a.model, a.cx, a.cy, b.model, b.cx, b.cy)
			}
		}
	}
	if n != len(r.events) {
		t.Fatalf("%d event markers, want %d", n, len(r.events))
	}
	// A lane's two rows and its label come before the next lane.
	for m, y := range laneY {
		for other, oy := range laneY {
			if m != other && oy >= y && oy-y < 9+4+7+9 { // second row, marker radius, label baseline, ascent
				t.Errorf("lanes of %s (y %v) and %s (y %v) are too close for a label and two rows", m, y, other, oy)
			}
		}
	}

	// One label per model, in its lane, above its first marker and
	// inside the picture.
	labels := map[string]int{}
	for _, tx := range shape.Texts {
		if tx.Class != "event-model" {
			continue
		}
		labels[tx.Model]++
		if tx.Text != tx.Model {
			t.Errorf("label %q for model %q", tx.Text, tx.Model)
		}
		if y := laneY[tx.Model]; tx.Y >= y || tx.Y < y-15 {
			t.Errorf("label of %s at y %v, its markers at %v: want it just above", tx.Model, tx.Y, y)
		}
		right := tx.X + labelWidth(tx.Model)
		if tx.Anchor == "end" {
			right = tx.X
		}
		if right > 960 || tx.X < 0 {
			t.Errorf("label of %s at x %v (anchor %q) leaves the picture", tx.Model, tx.X, tx.Anchor)
		}
	}
	for _, m := range []string{"qwen3:8b", "llama3.2:3b", "text encoder"} {
		if labels[m] != 1 {
			t.Errorf("%d labels of %s, want 1", labels[m], m)
		}
	}
}

// TestSVGEventWithoutModel: an event no model is named for gets a lane
// that says so, not an empty label.
func TestSVGEventWithoutModel(t *testing.T) {
	r := &recorder{events: []event{{at: time.Second / 2, kind: "oom"}}}
	var b strings.Builder
	if err := r.writeSVG(&b, "test"); err != nil {
		t.Fatal(err)
	}
	var shape eventShape
	if err := xml.Unmarshal([]byte(b.String()), &shape); err != nil {
		t.Fatalf("SVG is not well-formed: %v", err)
	}
	for _, tx := range shape.Texts {
		if tx.Class == "event-model" && tx.Text == "(no model)" {
			return
		}
	}
	t.Errorf("no \"(no model)\" label in:\n%s", b.String())
}
