package comfyuitest

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"sync"

	"github.com/coder/websocket"
)

// comfySocket is one client's WebSocket: messages queue up in order and a
// writer goroutine sends them, so that no slow client holds the worker.
type comfySocket struct {
	conn  *websocket.Conn
	ready chan struct{} // cap 1: messages are queued
	gone  chan struct{} // closed when the handler ends

	mu  sync.Mutex
	out [][]byte
}

func (s *comfySocket) push(msg []byte) {
	s.mu.Lock()
	s.out = append(s.out, msg)
	s.mu.Unlock()
	select {
	case s.ready <- struct{}{}:
	default:
	}
}

// sendLocked is PromptServer.send_sync: {"type": event, "data": data} to
// the socket of sid, or to every socket when sid is nil. A sid no socket
// has drops the message.
func (c *Server) sendLocked(event string, data any, sid *string) {
	msg, err := json.Marshal(jsonObj{{"type", event}, {"data", data}})
	if err != nil {
		return
	}
	if sid != nil {
		if s := c.sockets[*sid]; s != nil {
			s.push(msg)
		}
		return
	}
	for _, s := range c.sockets {
		s.push(msg)
	}
}

// handleWS is websocket_handler: the socket takes clientId's place (or a
// new sid), gets a status with its sid, and, when its client's prompt is
// running a node, that node.
func (c *Server) handleWS(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		http.Error(w, "server closed", http.StatusServiceUnavailable)
		return
	}
	c.wg.Add(1) // a hijacked connection: httptest's Close does not wait for it
	c.mu.Unlock()
	defer c.wg.Done()
	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{InsecureSkipVerify: true})
	if err != nil {
		return // Accept answered
	}
	defer conn.CloseNow()
	sid := r.URL.Query().Get("clientId")
	if sid == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		sid = hex.EncodeToString(b[:]) // uuid.uuid4().hex
	}
	s := &comfySocket{conn: conn, ready: make(chan struct{}, 1), gone: make(chan struct{})}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.sockets[sid] = s
	c.sendLocked("status", jsonObj{{"status", c.queueInfoLocked()}, {"sid", sid}}, &sid)
	if c.execTo != nil && *c.execTo == sid && c.lastNode != "" {
		c.sendLocked("executing", jsonObj{{"node", c.lastNode}}, &sid)
	}
	c.wg.Add(1)
	c.mu.Unlock()
	written := make(chan struct{})
	go c.writeLoop(s, written)
	defer func() {
		c.mu.Lock()
		if c.sockets[sid] == s {
			delete(c.sockets, sid)
		}
		c.mu.Unlock()
		close(s.gone)
		<-written
	}()

	first := true
	for {
		typ, data, err := conn.Read(c.ctx)
		if err != nil {
			return
		}
		if typ != websocket.MessageText {
			continue
		}
		v, err := decodeOrdered(data)
		if err != nil {
			continue // logged by ComfyUI, first_message unchanged
		}
		if o, ok := v.(jsonObj); ok && first {
			if t, _ := o.get("type"); t == "feature_flags" {
				msg, _ := json.Marshal(jsonObj{{"type", "feature_flags"}, {"data", jsonObj{
					{"supports_preview_metadata", true}, {"max_upload_size", comfyMaxBody},
				}}})
				s.push(msg)
			}
		}
		first = false
	}
}

// writeLoop sends s's queued messages in order until the handler ends,
// the ComfyUI closes or a write fails.
func (c *Server) writeLoop(s *comfySocket, written chan<- struct{}) {
	defer c.wg.Done()
	defer close(written)
	for {
		select {
		case <-s.ready:
		case <-s.gone:
			return
		case <-c.done:
			return
		}
		s.mu.Lock()
		batch := s.out
		s.out = nil
		s.mu.Unlock()
		for _, m := range batch {
			if err := s.conn.Write(c.ctx, websocket.MessageText, m); err != nil {
				s.conn.CloseNow()
				return
			}
		}
	}
}
