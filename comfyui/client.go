package comfyui

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/vramguard/vramguard"
)

// DefaultURL is where ComfyUI listens when started without --listen or
// --port.
const DefaultURL = "http://127.0.0.1:8188"

// Defaults of Options' zero values.
const (
	DefaultTimeout      = 5 * time.Second
	DefaultStatsTimeout = 2 * time.Second
	DefaultPollInterval = 500 * time.Millisecond
)

// maxReply bounds what the client reads of one reply (a /history of a
// long-running server can be large; a graph's outputs list every image).
const maxReply = 32 << 20

// Options configure a Client. The zero value talks to DefaultURL, with no
// GPU reader (a Free's receipt then rests on /system_stats alone).
type Options struct {
	// URL is ComfyUI's base URL; "" means DefaultURL.
	URL string
	// HTTPClient sends the requests; nil means a client of its own. Its
	// Timeout, when set, bounds every request, the WebSocket's dial
	// included.
	HTTPClient *http.Client
	// ClientID is the client_id prompts are submitted with and the
	// WebSocket's clientId (ComfyUI sends a prompt's progress only to the
	// socket of the id it was submitted with); "" means a random one.
	ClientID string
	// VRAM reads the GPU ComfyUI runs on, for Free's receipt and for the
	// holder Reader names; nil means none.
	VRAM vramguard.VRAMReader
	// Device is the index, as VRAM numbers devices, of the GPU ComfyUI
	// runs on (its --cuda-device as the driver numbers it).
	Device int
	// PID is ComfyUI's process; 0 means found, when VRAM lists processes,
	// as the process on this machine that listens on URL's port and whose
	// command line ends with /system_stats' argv (see Client.Process).
	PID uint32
	// Timeout bounds each short request (every route but /system_stats
	// and the waits); zero means DefaultTimeout.
	Timeout time.Duration
	// StatsTimeout bounds /system_stats: a slower answer is ErrBusy
	// (KindTransient), not a server that is down, since ComfyUI answers it
	// slowly while its worker frees memory. Zero means DefaultStatsTimeout.
	StatsTimeout time.Duration
	// PollInterval is how often Wait reads /history while no WebSocket
	// message says the prompt ended; zero means DefaultPollInterval.
	PollInterval time.Duration
	// Logger receives debug lines; nil discards them.
	Logger *slog.Logger
}

// Client talks to one ComfyUI server. It is safe for concurrent use.
// Close ends its WebSocket; a closed client fails with vramguard.ErrClosed.
type Client struct {
	base   *url.URL
	hc     *http.Client
	id     string
	opts   Options
	log    *slog.Logger
	ws     socket
	pids   pidCache
	pinned pinnedSeen
	floor  floorSeen
	own    ownPrompts

	procRoot string // the process table ("" is /proc); set by tests

	closeOnce sync.Once
	closed    chan struct{}
}

// New checks opts and returns a client. It sends nothing.
func New(opts Options) (*Client, error) {
	const op = "comfyui: new"
	raw := cmp.Or(opts.URL, DefaultURL)
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: fmt.Errorf("URL %q is not an http(s) URL with a host", raw)}
	}
	u.Path = strings.TrimSuffix(u.Path, "/")
	switch {
	case opts.Device < 0:
		return nil, &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: fmt.Errorf("negative device index %d", opts.Device)}
	case opts.Timeout < 0 || opts.StatsTimeout < 0 || opts.PollInterval < 0:
		return nil, &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: errors.New("negative Timeout, StatsTimeout or PollInterval")}
	}
	opts.Timeout = cmp.Or(opts.Timeout, DefaultTimeout)
	opts.StatsTimeout = cmp.Or(opts.StatsTimeout, DefaultStatsTimeout)
	opts.PollInterval = cmp.Or(opts.PollInterval, DefaultPollInterval)
	c := &Client{base: u, hc: opts.HTTPClient, id: opts.ClientID, opts: opts, log: opts.Logger, closed: make(chan struct{})}
	if c.hc == nil {
		c.hc = &http.Client{}
	}
	if c.id == "" {
		c.id = newID()
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.ws.c = c
	return c, nil
}

// URL is the server's base URL.
func (c *Client) URL() string { return c.base.String() }

// ClientID is the client_id this client submits prompts with.
func (c *Client) ClientID() string { return c.id }

// Close ends the client's WebSocket and waits for its reader; later
// calls fail with vramguard.ErrClosed. It is idempotent.
func (c *Client) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	c.ws.close()
	return nil
}

func (c *Client) checkOpen(op string) error {
	select {
	case <-c.closed:
		return &vramguard.Error{Op: op, Kind: vramguard.KindCanceled, Err: vramguard.ErrClosed}
	default:
		return nil
	}
}

// newID is a random UUID (version 4), the form ComfyUI gives ids.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// endpoint is the URL of path on the server.
func (c *Client) endpoint(path string) string {
	u := *c.base
	u.Path += path
	return u.String()
}

// do sends one request (a JSON body when in is not nil) within timeout
// and decodes a 200's JSON into out (when not nil). Errors are
// *vramguard.Error values: KindUnavailable when nothing answers,
// KindTransient (ErrBusy) when the answer is later than timeout,
// KindInvalidInput for a 400 (a *PromptError when it is ComfyUI's), and
// KindServer for another status.
func (c *Client) do(ctx context.Context, op, method, path string, in, out any, timeout time.Duration) error {
	if err := c.checkOpen(op); err != nil {
		return err
	}
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: err}
		}
		body = bytes.NewReader(b)
	}
	rctx, cancel := context.WithTimeoutCause(ctx, timeout, errSlow)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, method, c.endpoint(path), body)
	if err != nil {
		return &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: err}
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return c.sendError(ctx, rctx, op, timeout, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxReply+1))
	if err != nil {
		return c.sendError(ctx, rctx, op, timeout, err)
	}
	if len(data) > maxReply {
		return &vramguard.Error{Op: op, Kind: vramguard.KindServer, Err: fmt.Errorf("%s %s: reply larger than %d bytes", method, path, maxReply)}
	}
	if resp.StatusCode != http.StatusOK {
		return statusError(op, method, path, resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return &vramguard.Error{Op: op, Kind: vramguard.KindServer, Err: fmt.Errorf("%s %s: undecodable reply: %w", method, path, err)}
	}
	return nil
}

// errSlow is the cause of a request's own timeout.
var errSlow = errors.New("no answer within the request's timeout")

// sendError classifies a failed exchange: the caller's ctx, the
// request's timeout (busy), or a server that does not answer.
func (c *Client) sendError(ctx, rctx context.Context, op string, timeout time.Duration, err error) error {
	switch {
	case ctx.Err() != nil:
		return &vramguard.Error{Op: op, Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
	case errors.Is(context.Cause(rctx), errSlow):
		return &vramguard.Error{Op: op, Kind: vramguard.KindTransient, Err: fmt.Errorf("%w: no answer within %v", ErrBusy, timeout)}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &vramguard.Error{Op: op, Kind: vramguard.KindTransient, Err: fmt.Errorf("%w: %v", ErrBusy, err)}
	}
	return &vramguard.Error{Op: op, Kind: vramguard.KindUnavailable, Err: fmt.Errorf("ComfyUI at %s does not answer: %w", c.base.Host, err)}
}

// statusError is the error of a reply that is not 200.
func statusError(op, method, path string, code int, body []byte) error {
	if code == http.StatusConflict && path == "/prompt" { // today's "prompt_id already exists"
		pe := PromptError{Status: code}
		var wire struct {
			Error PromptError `json:"error"`
		}
		if json.Unmarshal(body, &wire) == nil && wire.Error.Message != "" {
			pe.Type, pe.Message, pe.Details = wire.Error.Type, wire.Error.Message, wire.Error.Details
		} else {
			pe.Message = clip(body)
		}
		return &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: &pe}
	}
	if code == http.StatusBadRequest {
		pe := PromptError{Status: code}
		var wire struct {
			Error      json.RawMessage      `json:"error"`
			NodeErrors map[string]NodeError `json:"node_errors"`
		}
		if json.Unmarshal(body, &wire) == nil && len(wire.Error) > 0 {
			if json.Unmarshal(wire.Error, &pe) != nil { // an older ComfyUI answers "error": "<text>"
				var text string
				_ = json.Unmarshal(wire.Error, &text)
				pe.Message = text
			}
			pe.NodeErrors = wire.NodeErrors
			return &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: &pe}
		}
		return &vramguard.Error{Op: op, Kind: vramguard.KindInvalidInput, Err: fmt.Errorf("%s %s: 400: %s", method, path, clip(body))}
	}
	kind := vramguard.KindServer
	if code == http.StatusNotFound {
		kind = vramguard.KindNotFound
	}
	return &vramguard.Error{Op: op, Kind: kind, Err: fmt.Errorf("%s %s: status %d: %s", method, path, code, clip(body))}
}

// clip shortens a body for an error message.
func clip(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 200 {
		s = s[:200] + "..."
	}
	return s
}
