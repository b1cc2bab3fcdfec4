package vramguard

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/ollama/ollama/api"
)

type keepAliveMode uint8

const (
	keepAliveUnload keepAliveMode = iota // zero value: unload after the request
	keepAliveFor
	keepAliveForever
	keepAliveServer
)

// KeepAlive says how long the Ollama server keeps a model loaded after a
// request. It can only produce values the server accepts.
//
// The zero value is KeepAliveUnload: the model is unloaded as soon as the
// request ends, which is the safe choice on a GPU shared with a bigger model.
type KeepAlive struct {
	mode keepAliveMode
	d    time.Duration
}

var (
	// KeepAliveUnload unloads the model when the request ends ("0s" on the wire).
	KeepAliveUnload = KeepAlive{}
	// KeepAliveForever keeps the model loaded until it is unloaded explicitly (-1).
	KeepAliveForever = KeepAlive{mode: keepAliveForever}
	// KeepAliveServerDefault sends no keep_alive at all: the model keeps the
	// duration it already has, or OLLAMA_KEEP_ALIVE (5 minutes) on a new load.
	// Keep-alive is sticky and last-writer-wins on the server, so this is the
	// only value that does not change what other clients of the model set.
	KeepAliveServerDefault = KeepAlive{mode: keepAliveServer}
)

// KeepAliveFor keeps the model loaded for d after the request ends.
// d <= 0 means KeepAliveUnload. Durations are truncated to milliseconds.
func KeepAliveFor(d time.Duration) KeepAlive {
	d = d.Truncate(time.Millisecond)
	if d <= 0 {
		return KeepAliveUnload
	}
	return KeepAlive{mode: keepAliveFor, d: d}
}

// Duration returns the keep-alive duration and whether one is sent:
// 0 for unload, a negative value for forever, and ok == false for
// KeepAliveServerDefault.
func (k KeepAlive) Duration() (d time.Duration, ok bool) {
	switch k.mode {
	case keepAliveFor:
		return k.d, true
	case keepAliveForever:
		return -1, true
	case keepAliveServer:
		return 0, false
	default:
		return 0, true
	}
}

// String returns the value as it is sent on the wire ("0s", "2m0s", "-1"),
// or "default" for KeepAliveServerDefault.
func (k KeepAlive) String() string {
	switch k.mode {
	case keepAliveFor:
		return k.d.String()
	case keepAliveForever:
		return "-1"
	case keepAliveServer:
		return "default"
	default:
		return "0s"
	}
}

// apiDuration returns the value for api.GenerateRequest.KeepAlive.
func (k KeepAlive) apiDuration() *api.Duration {
	d, ok := k.Duration()
	if !ok {
		return nil
	}
	return &api.Duration{Duration: d}
}

// cliFlag returns the value for `ollama run --keepalive`, which takes a Go
// duration string; forever is spelled "-1s". For KeepAliveServerDefault it
// returns "" (no flag).
func (k KeepAlive) cliFlag() string {
	switch k.mode {
	case keepAliveFor:
		return k.d.String()
	case keepAliveForever:
		return "-1s"
	case keepAliveServer:
		return ""
	default:
		return "0s"
	}
}

// ParseKeepAlive reads a keep-alive from configuration text: "0", "0s" or
// "unload"; a Go duration ("90s", "2m"); a number of seconds ("300");
// "-1", any negative duration, or "forever"; "" or "default" for
// KeepAliveServerDefault. Anything else is a KindInvalidInput error.
func ParseKeepAlive(s string) (KeepAlive, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	switch t {
	case "", "default":
		return KeepAliveServerDefault, nil
	case "unload":
		return KeepAliveUnload, nil
	case "forever", "inf", "infinite":
		return KeepAliveForever, nil
	}
	if n, err := strconv.ParseFloat(t, 64); err == nil {
		return keepAliveSeconds(s, n)
	}
	d, err := time.ParseDuration(t)
	if err != nil {
		return KeepAlive{}, invalid("parse keep-alive", "", "keep-alive %q: want a duration such as 0s, 2m, -1 or forever", s)
	}
	if d < 0 {
		return KeepAliveForever, nil
	}
	return KeepAliveFor(d), nil
}

func keepAliveSeconds(s string, n float64) (KeepAlive, error) {
	const maxSeconds = float64(1<<63-1) / float64(time.Second)
	switch {
	case n != n: // NaN
		return KeepAlive{}, invalid("parse keep-alive", "", "keep-alive %q is not a number of seconds", s)
	case n < 0:
		return KeepAliveForever, nil
	case n >= maxSeconds:
		return KeepAlive{}, invalid("parse keep-alive", "", "keep-alive %q is too long; use forever", s)
	}
	return KeepAliveFor(time.Duration(n * float64(time.Second))), nil
}

// validate is used by callers that accept a KeepAlive built by hand.
func (k KeepAlive) validate() error {
	if k.mode > keepAliveServer || (k.mode == keepAliveFor && k.d <= 0) {
		return fmt.Errorf("keep-alive is malformed")
	}
	return nil
}
