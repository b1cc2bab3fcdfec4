package comfyui

import (
	"context"
	"encoding/json"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/vramguard/vramguard"
)

// Result is how a prompt ended, from its /history entry.
type Result struct {
	PromptID  string
	Status    string // "success" or "error"
	Completed bool
	// Outputs are the output nodes' results by node id, as ComfyUI
	// reports them.
	Outputs map[string]json.RawMessage
	// Images are the images the output nodes list.
	Images []Image
}

// Image is one image an output node produced (ComfyUI's /view names it).
type Image struct {
	Node      string `json:"-"`
	Filename  string `json:"filename"`
	Subfolder string `json:"subfolder"`
	Type      string `json:"type"`
}

// Run submits wf and waits for it to end (Submit, then Wait). When ctx
// ends first, Run cancels its prompt on ComfyUI (see Wait), so that no
// render of a caller that gave up keeps the GPU; every error after the
// prompt was sent names its id (a *WaitError or an *ExecutionError).
func (c *Client) Run(ctx context.Context, wf Workflow) (*Result, error) {
	q, err := c.Submit(ctx, wf)
	if err != nil {
		return nil, err
	}
	return c.Wait(ctx, q.PromptID)
}

// Wait waits for promptID to end and returns its result: a prompt that
// failed or was interrupted is also a *ExecutionError (see its kinds).
// It learns of the end from the client's WebSocket (ComfyUI sends a
// prompt's messages to the socket of the client_id it was submitted
// with, so a prompt of this client's ends at once) and reads /history
// every Options.PollInterval besides (the only way for another client's
// prompt, or where no WebSocket is possible). Wait is bounded by ctx
// only: a render takes what it takes. When ctx ends first, a prompt this
// client submitted is cancelled on ComfyUI (POST /api/jobs/{id}/cancel,
// else /queue's delete and /interrupt, under context.WithoutCancel(ctx)
// and Options.Timeout), another client's is left alone; the error, of
// KindTimeout for a deadline and KindCanceled otherwise, holds a
// *WaitError naming the prompt. A ComfyUI that stops answering ends it
// with KindUnavailable (inside a *WaitError too); one that answers
// slowly is waited for.
func (c *Client) Wait(ctx context.Context, promptID string) (*Result, error) {
	return c.wait(ctx, promptID, true)
}

// wait is Wait; cancelOwn says whether a prompt of this client's is
// cancelled when ctx ends (not for a free's wait for the running prompt).
func (c *Client) wait(ctx context.Context, promptID string, cancelOwn bool) (*Result, error) {
	const op = "comfyui: wait"
	if promptID == "" {
		return nil, invalidf(op, "no prompt id")
	}
	start := time.Now()
	ended, unsub := c.ws.subscribe(ctx, promptID)
	defer unsub()
	t := time.NewTicker(c.opts.PollInterval)
	defer t.Stop()
	for {
		h, err := c.history(ctx, promptID)
		switch {
		case err == nil && h != nil:
			c.own.drop(promptID)
			return result(promptID, h)
		case err != nil && ctx.Err() == nil && vramguard.KindOf(err) != vramguard.KindTransient:
			return nil, &vramguard.Error{Op: op, Kind: vramguard.KindOf(err), Err: &WaitError{PromptID: promptID, Waited: time.Since(start), Err: err}}
		}
		select {
		case <-ctx.Done():
			if cancelOwn && c.own.drop(promptID) {
				c.cancelPrompt(ctx, promptID)
			}
			return nil, &vramguard.Error{Op: op, Kind: ctxKind(ctx), Err: &WaitError{PromptID: promptID, Waited: time.Since(start), Err: ctxCause(ctx)}}
		case <-c.closed:
			return nil, &vramguard.Error{Op: op, Kind: vramguard.KindCanceled, Err: &WaitError{PromptID: promptID, Waited: time.Since(start), Err: vramguard.ErrClosed}}
		case <-ended:
		case <-t.C:
		}
	}
}

// ownPrompts are the prompts this client submitted that have not been
// seen to end.
type ownPrompts struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

func (o *ownPrompts) add(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.ids == nil {
		o.ids = map[string]struct{}{}
	}
	o.ids[id] = struct{}{}
}

// drop forgets id and says whether it was this client's.
func (o *ownPrompts) drop(id string) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, ok := o.ids[id]
	delete(o.ids, id)
	return ok
}

// WaitIdle waits until ComfyUI's queue is empty: nothing running, nothing
// waiting. Like Wait it is woken by the WebSocket's status messages and
// reads /queue every PollInterval besides, and is bounded by ctx only.
func (c *Client) WaitIdle(ctx context.Context) error {
	const op = "comfyui: wait idle"
	changed, unsub := c.ws.subscribe(ctx, "")
	defer unsub()
	t := time.NewTicker(c.opts.PollInterval)
	defer t.Stop()
	for {
		q, err := c.Queue(ctx)
		switch {
		case err == nil && !q.Busy():
			return nil
		case err != nil && vramguard.KindOf(err) != vramguard.KindTransient:
			return err
		}
		select {
		case <-ctx.Done():
			return &vramguard.Error{Op: op, Kind: vramguard.KindCanceled, Err: context.Cause(ctx)}
		case <-c.closed:
			return &vramguard.Error{Op: op, Kind: vramguard.KindCanceled, Err: vramguard.ErrClosed}
		case <-changed:
		case <-t.C:
		}
	}
}

// result turns a history entry into a Result, and a failed or
// interrupted prompt into its *ExecutionError as well.
func result(id string, h *historyEntry) (*Result, error) {
	r := &Result{PromptID: id, Status: h.Status.StatusStr, Completed: h.Status.Completed, Outputs: h.Outputs}
	for node, raw := range h.Outputs {
		var out struct {
			Images []Image `json:"images"`
		}
		if json.Unmarshal(raw, &out) == nil {
			for _, im := range out.Images {
				im.Node = node
				r.Images = append(r.Images, im)
			}
		}
	}
	if r.Status != "error" {
		return r, nil
	}
	ee := &ExecutionError{PromptID: id}
	for _, m := range h.Status.Messages {
		if len(m) < 2 {
			continue
		}
		var event string
		_ = json.Unmarshal(m[0], &event)
		var d struct {
			NodeID        string `json:"node_id"`
			NodeType      string `json:"node_type"`
			ExceptionType string `json:"exception_type"`
			Message       string `json:"exception_message"`
		}
		switch event {
		case "execution_error", "execution_interrupted":
			_ = json.Unmarshal(m[1], &d)
			ee.Interrupted = event == "execution_interrupted"
			ee.NodeID, ee.NodeType, ee.ExceptionType, ee.Message = d.NodeID, d.NodeType, d.ExceptionType, d.Message
			if event == "execution_error" && ee.outOfMemory() {
				ee.Bytes = oomBytes(d.Message)
			}
		}
	}
	kind := vramguard.KindServer
	switch {
	case ee.Interrupted:
		kind = vramguard.KindCanceled
	case ee.outOfMemory():
		kind = vramguard.KindOutOfMemory
	}
	return r, &vramguard.Error{Op: "comfyui: wait", Kind: kind, Err: ee}
}

// socket is the client's one WebSocket (/ws?clientId=ID): ComfyUI keeps
// one socket per client id, so the client's waiters share it. It is
// dialed by the first waiter, read by one goroutine, redialed by a waiter
// after it breaks, and closed by Client.Close, which joins the reader.
type socket struct {
	c *Client

	mu     sync.Mutex
	conn   *websocket.Conn
	cancel context.CancelFunc
	closed bool
	subs   map[string]map[chan struct{}]struct{} // by prompt id; "" hears queue changes
	// failedAt is when the last dial failed: waiters then poll alone for
	// a while instead of dialing each time.
	failedAt time.Time
	wg       sync.WaitGroup
}

// redialAfter is how long after a failed dial waiters poll alone.
const redialAfter = 5 * time.Second

// subscribe returns a channel signalled when a message about key (a
// prompt id, or "" for the queue) arrives or the socket breaks. Without a
// socket (none can be dialed) the channel is never signalled and the
// caller polls.
func (s *socket) subscribe(ctx context.Context, key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ch, func() {}
	}
	if s.subs == nil {
		s.subs = map[string]map[chan struct{}]struct{}{}
	}
	if s.subs[key] == nil {
		s.subs[key] = map[chan struct{}]struct{}{}
	}
	s.subs[key][ch] = struct{}{}
	if s.conn == nil && time.Since(s.failedAt) >= redialAfter {
		s.dialLocked(ctx)
	}
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.subs[key], ch)
		if len(s.subs[key]) == 0 {
			delete(s.subs, key)
		}
	}
}

// dialLocked opens the socket and starts its reader. A failure is
// logged; the waiters poll.
func (s *socket) dialLocked(ctx context.Context) {
	c := s.c
	u := *c.base
	u.Scheme = strings.Replace(u.Scheme, "http", "ws", 1)
	u.Path += "/ws"
	u.RawQuery = url.Values{"clientId": {c.id}}.Encode()
	dctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	conn, _, err := websocket.Dial(dctx, u.String(), &websocket.DialOptions{HTTPClient: c.hc})
	if err != nil {
		s.failedAt = time.Now()
		c.log.Debug("comfyui: no WebSocket; polling /history and /queue", "url", u.String(), "err", err)
		return
	}
	conn.SetReadLimit(maxReply)
	rctx, rcancel := context.WithCancel(context.Background())
	s.conn, s.cancel = conn, rcancel
	s.wg.Add(1)
	go s.read(rctx, conn)
}

// read dispatches the socket's messages until it breaks or is closed.
func (s *socket) read(ctx context.Context, conn *websocket.Conn) {
	defer s.wg.Done()
	defer conn.CloseNow()
	for {
		typ, data, err := conn.Read(ctx)
		if err != nil {
			s.mu.Lock()
			if s.conn == conn {
				s.conn = nil
			}
			for _, set := range s.subs { // the waiters look again, and redial
				for ch := range set {
					signal(ch)
				}
			}
			s.mu.Unlock()
			return
		}
		if typ != websocket.MessageText { // preview images
			continue
		}
		var m struct {
			Type string `json:"type"`
			Data struct {
				PromptID string          `json:"prompt_id"`
				Node     json.RawMessage `json:"node"`
			} `json:"data"`
		}
		if json.Unmarshal(data, &m) != nil {
			continue
		}
		key, ok := "", false
		switch m.Type {
		case "status":
			ok = true
		case "execution_success", "execution_error", "execution_interrupted":
			key, ok = m.Data.PromptID, true
		case "executing":
			key, ok = m.Data.PromptID, string(m.Data.Node) == "null"
		}
		if !ok {
			continue
		}
		s.mu.Lock()
		for ch := range s.subs[key] {
			signal(ch)
		}
		s.mu.Unlock()
	}
}

// close ends the socket for good and joins its reader.
func (s *socket) close() {
	s.mu.Lock()
	s.closed = true
	if s.cancel != nil {
		s.cancel()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
