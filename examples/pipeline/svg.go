package main

import (
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"time"
)

// Colours of the picture.
var (
	lineColours  = []string{"#1f77b4", "#9467bd", "#8c564b", "#17becf"}
	bandColours  = []string{"#f2f2f2", "#e4ecf7"}
	markerColour = map[string]string{
		"admitted":          "#bcbd22",
		"load":              "#ff7f0e",
		"unload requested":  "#7f7f7f",
		"budget eviction":   "#9467bd",
		"eviction verified": "#2ca02c",
		"oom":               "#d62728",
	}
)

// writeSVG draws device memory over time: one line per device, a band per
// step, a marker per lifecycle event in its model's lane, and the device's
// total as a dashed line.
func (r *recorder) writeSVG(w io.Writer, title string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	const (
		width, height  = 960, 420
		left, right    = 70, 20
		top, bottom    = 50, 110
		plotW, plotH   = width - left - right, height - top - bottom
		legendY        = height - 30
		minimumSeconds = 1.0
	)
	end := 0.0
	for _, s := range r.samples {
		end = max(end, s.at.Seconds())
	}
	for _, sp := range r.spans {
		end = max(end, sp.to.Seconds())
	}
	end = max(end, minimumSeconds)
	ymax := float64(r.total)
	for _, s := range r.samples {
		for _, u := range s.used {
			ymax = max(ymax, float64(u))
		}
	}
	if ymax == 0 {
		ymax = 1
	}
	x := func(d time.Duration) float64 { return left + d.Seconds()/end*plotW }
	y := func(b float64) float64 { return top + plotH - b/ymax*plotH }

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	fmt.Fprintf(&b, `<title>%s</title>`+"\n", html.EscapeString(title))
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%d" height="%d" fill="white"/>`+"\n", width, height)
	fmt.Fprintf(&b, `<text x="%d" y="24" font-size="15" font-weight="bold">%s</text>`+"\n", left, html.EscapeString(title))

	// Step bands with their names.
	for i, sp := range r.spans {
		x0, x1 := x(sp.from), x(sp.to)
		fmt.Fprintf(&b, `<rect class="step" data-step="%s" x="%.1f" y="%d" width="%.1f" height="%d" fill="%s"/>`+"\n",
			html.EscapeString(sp.name), x0, top, max(x1-x0, 1), plotH, bandColours[i%len(bandColours)])
		ly := top + plotH + 28 + (i%4)*11 // stagger the names of short steps
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#999"/>`+"\n", x0, top+plotH, x0, ly-9)
		fmt.Fprintf(&b, `<text class="step-name" x="%.1f" y="%d" font-size="10">%s</text>`+"\n", x0+2, ly, html.EscapeString(sp.name))
	}

	// Axes, grid and the device's total.
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top+plotH, left+plotW, top+plotH)
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="black"/>`+"\n", left, top, left, top+plotH)
	for i := 0; i <= 4; i++ {
		v := ymax * float64(i) / 4
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%.1f GB</text>`+"\n", left-6, y(v)+4, v/1e9)
	}
	for i := 0; i <= 5; i++ {
		t := end * float64(i) / 5
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%.1f s</text>`+"\n", left+t/end*plotW, top+plotH+14, t)
	}
	if r.total > 0 {
		fmt.Fprintf(&b, `<line class="total" x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#d62728" stroke-dasharray="6 4"/>`+"\n",
			left, y(float64(r.total)), left+plotW, y(float64(r.total)))
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" fill="#d62728" text-anchor="end">device total %s</text>`+"\n",
			left+plotW, y(float64(r.total))-4, gb(r.total))
	}

	// One line of used memory per device.
	for dev, name := range r.devices {
		var pts []string
		for _, s := range r.samples {
			if dev < len(s.used) {
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.at), y(float64(s.used[dev]))))
			}
		}
		fmt.Fprintf(&b, `<polyline class="device" data-device="%d" fill="none" stroke="%s" stroke-width="2" points="%s"><title>%s used</title></polyline>`+"\n",
			dev, lineColours[dev%len(lineColours)], strings.Join(pts, " "), html.EscapeString(name))
	}

	// Event markers: a lane per model, named above its first marker, so
	// that events of different models never share a row however close in
	// time they come. A marker that would cover one before it in its lane
	// (events of one model at once) goes on the lane's second row, or, if
	// that is taken too, just after the last marker there. Each marker's
	// tooltip names its time, kind and model.
	lanes := eventLanes(r.events)
	// markGap: a marker's width and a pixel. laneH: the label (its baseline
	// 7 px above the lane, 9 px of ascent) and two rows of markers.
	const markGap, laneTop = 9, top + 22
	const laneH = 7 + 9 + markGap + 4 + 1
	maxLanes := max((plotH-laneTop+top)/laneH, 1)
	laneY := func(l int) float64 { return float64(laneTop + (l%maxLanes)*laneH) }
	for l, ln := range lanes {
		x0, x1, cy := x(ln.from), x(ln.to), laneY(l)
		fmt.Fprintf(&b, `<line class="lane" data-model="%s" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#bbb"/>`+"\n",
			html.EscapeString(ln.model), x0, cy, x1, cy)
		anchor, lx := "start", x0-4
		if lx+labelWidth(ln.model) > left+plotW { // would run off the plot: end at the marker
			anchor, lx = "end", x0+4
		}
		fmt.Fprintf(&b, `<text class="event-model" data-model="%s" x="%.1f" y="%.1f" font-size="10" text-anchor="%s" paint-order="stroke" stroke="white" stroke-width="3">%s</text>`+"\n",
			html.EscapeString(ln.model), lx, cy-7, anchor, html.EscapeString(ln.label()))
	}
	lastX := make([][2]float64, len(lanes)) // the last marker on each lane's two rows
	for i := range lastX {
		lastX[i] = [2]float64{math.Inf(-1), math.Inf(-1)}
	}
	for _, e := range r.events {
		colour := markerColour[e.kind]
		if colour == "" {
			colour = "black"
		}
		l, cx := laneOf(lanes, e.model), x(e.at)
		row := 0
		switch last := lastX[l]; {
		case cx-last[0] >= markGap:
		case cx-last[1] >= markGap:
			row = 1
		default: // both taken: after the earlier of the two
			row = 1
			if last[0] < last[1] {
				row = 0
			}
			cx = last[row] + markGap
		}
		lastX[l][row] = cx
		cy := laneY(l) + float64(row*markGap)
		fmt.Fprintf(&b, `<circle class="event" data-kind="%s" data-model="%s" cx="%.1f" cy="%.1f" r="4" fill="%s" stroke="white"><title>%.2fs %s %s</title></circle>`+"\n",
			html.EscapeString(e.kind), html.EscapeString(e.model), cx, cy, colour,
			e.at.Seconds(), html.EscapeString(e.kind), html.EscapeString(modelLabel(e.model)))
	}

	// Legend.
	lx := left
	for dev, name := range r.devices {
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/><text x="%d" y="%d">%s</text>`+"\n",
			lx, legendY, lx+20, legendY, lineColours[dev%len(lineColours)], lx+24, legendY+4, html.EscapeString(name+" used"))
		lx += 60 + 7*len(name)
	}
	for _, k := range []string{"admitted", "load", "unload requested", "budget eviction", "eviction verified", "oom"} {
		fmt.Fprintf(&b, `<circle cx="%d" cy="%d" r="4" fill="%s"/><text x="%d" y="%d">%s</text>`+"\n",
			lx+4, legendY, markerColour[k], lx+12, legendY+4, k)
		lx += 30 + 7*len(k)
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// lane is the row of one model's event markers.
type lane struct {
	model    string
	from, to time.Duration // its first and last event
}

func (l lane) label() string { return modelLabel(l.model) }

// modelLabel names an event's model; an event without one says so.
func modelLabel(model string) string {
	if model == "" {
		return "(no model)"
	}
	return model
}

// eventLanes returns a lane per model, in the order of their first events.
func eventLanes(events []event) []lane {
	var lanes []lane
	for _, e := range events {
		if i := laneOf(lanes, e.model); i >= 0 {
			lanes[i].from, lanes[i].to = min(lanes[i].from, e.at), max(lanes[i].to, e.at)
			continue
		}
		lanes = append(lanes, lane{model: e.model, from: e.at, to: e.at})
	}
	return lanes
}

// laneOf is the index of model's lane, -1 if it has none.
func laneOf(lanes []lane, model string) int {
	for i, l := range lanes {
		if l.model == model {
			return i
		}
	}
	return -1
}

// labelWidth is about how wide a model's label is at font-size 10: no
// font's metrics are at hand, so it counts 6 px a character, an upper
// bound for sans-serif.
func labelWidth(model string) float64 { return 6 * float64(len([]rune(modelLabel(model)))) }
