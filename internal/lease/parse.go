package lease

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Parse reads one lease file's content. It is strict: at most MaxFileBytes
// bytes of valid UTF-8 holding exactly one JSON object whose keys are
// spelled exactly (encoding/json's case-insensitive matching is not used)
// and appear once, with v 1, an id of 16 lower-case hex digits, a pid
// above 0 and a created time (the times are returned in UTC, and must lie
// in years 1 to 9999 there); a lease on a model has a server and a model
// that are not empty and no field of a reservation's own (device, uuid,
// for_base, load), though it may name a recipient (for, for_pid); a
// reservation (bytes above zero, at most MaxBytes) no model, a device and
// for_pid of at least zero and a for_base of at most MaxBytes.
// Unknown keys are allowed and ignored, so that a later version can add
// fields. Anything else is an *Error of Kind ErrMalformed. Path and UID
// are left empty. Parse keeps no state and is safe for concurrent use.
func Parse(b []byte) (Record, error) {
	r, err := parse(b)
	if err != nil {
		return Record{}, &Error{Op: "parse", Kind: ErrMalformed, Err: err}
	}
	return r, nil
}

func parse(b []byte) (Record, error) {
	var r Record
	if len(b) > MaxFileBytes {
		return r, fmt.Errorf("%d bytes, over %d", len(b), MaxFileBytes)
	}
	if !utf8.Valid(b) {
		return r, errors.New("not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil {
		return r, err
	} else if tok != json.Delim('{') {
		return r, errors.New("not a JSON object")
	}
	seen := make(map[string]bool, 8)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return r, err
		}
		key, ok := tok.(string)
		if !ok { // cannot happen inside an object; kept as a guard
			return r, fmt.Errorf("key %v is not a string", tok)
		}
		if seen[key] {
			return r, fmt.Errorf("key %q appears twice", key)
		}
		seen[key] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return r, err
		}
		var dst any
		switch key {
		case "v":
			dst = &r.Version
		case "id":
			dst = &r.ID
		case "server":
			dst = &r.Server
		case "model":
			dst = &r.Model
		case "pid":
			dst = &r.PID
		case "program":
			dst = &r.Program
		case "note":
			dst = &r.Note
		case "created":
			dst = &r.Created
		case "until":
			dst = &r.Until
		case "device":
			dst = &r.Device
		case "uuid":
			dst = &r.UUID
		case "bytes":
			dst = &r.Bytes
		case "for":
			dst = &r.For
		case "for_pid":
			dst = &r.ForPID
		case "for_base":
			dst = &r.ForBase
		case "load":
			dst = &r.Load
		default:
			continue
		}
		if err := json.Unmarshal(raw, dst); err != nil {
			return r, fmt.Errorf("%s: %w", key, err)
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return r, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return r, errors.New("data after the object")
	}
	switch {
	case r.Version != 1:
		return r, fmt.Errorf("v is %d, not 1", r.Version)
	case !validID(r.ID):
		return r, fmt.Errorf("id %q is not 16 lower-case hex digits", r.ID)
	case r.Bytes > MaxBytes || r.ForBase > MaxBytes:
		return r, fmt.Errorf("bytes %d or for_base %d over %d", r.Bytes, r.ForBase, uint64(MaxBytes))
	case r.IsReservation() && r.Model != "":
		return r, errors.New("a reservation (bytes) names a model")
	case r.IsReservation() && r.Device < 0:
		return r, fmt.Errorf("device %d", r.Device)
	case r.ForPID < 0:
		return r, fmt.Errorf("for_pid %d", r.ForPID)
	case !r.IsReservation() && (r.Device != 0 || r.UUID != "" || r.ForBase != 0 || r.Load != ""):
		return r, errors.New("a lease on a model has reservation fields")
	case !r.IsReservation() && r.Server == "":
		return r, errors.New("no server")
	case !r.IsReservation() && r.Model == "":
		return r, errors.New("no model")
	case r.PID <= 0:
		return r, fmt.Errorf("pid %d", r.PID)
	case r.Created.IsZero():
		return r, errors.New("no created time")
	}
	r.Created = r.Created.UTC()
	if y := r.Created.Year(); y < 1 || y > 9999 {
		return r, fmt.Errorf("created in year %d (UTC)", y)
	}
	if !r.Until.IsZero() {
		r.Until = r.Until.UTC()
		if y := r.Until.Year(); y < 1 || y > 9999 {
			return r, fmt.Errorf("until in year %d (UTC)", y)
		}
	}
	return r, nil
}

func validID(s string) bool {
	if len(s) != 16 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// encode is the file's content for r: one line of JSON, without HTML
// escaping (a model name may hold '<' or '&').
func encode(r Record) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(r); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// NormalizeServer turns what OLLAMA_HOST or a client's base URL may say into
// the one spelling a lease names a server by, "host:port", so that every
// client of one server finds the others' leases:
//
//   - lower case, surrounding space trimmed;
//   - the scheme, user info, path, query and fragment dropped (two servers
//     behind one proxy, told apart only by path, share leases: that errs
//     towards keeping a model, never towards unloading it);
//   - the port 11434 (Ollama's) when absent or not a number from 0 to
//     65535 (as Ollama does), or 443 after "https://"; written without
//     leading zeros;
//   - "", "localhost" and 0.0.0.0 (where a server listens on every address)
//     become 127.0.0.1, and [::] becomes [::1]; IP addresses are written
//     the canonical way (IPv4-mapped IPv6 as IPv4), IPv6 in brackets; a
//     host name's trailing dots are dropped.
//
// So "http://LOCALHOST:11434/" and "localhost" are "127.0.0.1:11434", and
// "[::1]:1" stays "[::1]:1". NormalizeServer of its own result returns it
// unchanged. It never fails: text that is no address still comes back as
// "host:port", lower-cased.
func NormalizeServer(host string) string {
	s := strings.ToLower(strings.TrimSpace(host))
	port := "11434"
	if scheme, rest, ok := strings.Cut(s, "://"); ok {
		if scheme == "https" {
			port = "443"
		}
		s = rest
	}
	if i := strings.IndexAny(s, "/?#"); i >= 0 {
		s = s[:i]
	}
	if i := strings.LastIndexByte(s, '@'); i >= 0 {
		s = s[i+1:]
	}
	var h, p string
	if end := strings.IndexByte(s, ']'); strings.HasPrefix(s, "[") && end > 0 {
		h = s[1:end]
		if after, ok := strings.CutPrefix(s[end+1:], ":"); ok {
			p = after
		}
	} else {
		s = strings.Trim(s, "[]")
		switch strings.Count(s, ":") {
		case 0:
			h = s
		case 1:
			h, p, _ = strings.Cut(s, ":")
		default: // an IPv6 address without brackets, so without a port
			h = s
		}
	}
	h = strings.NewReplacer("[", "", "]", "").Replace(h)
	h = strings.TrimRightFunc(strings.TrimSpace(h), func(r rune) bool { return r == '.' || unicode.IsSpace(r) })
	if n, err := strconv.ParseUint(strings.TrimSpace(p), 10, 16); err == nil {
		port = strconv.FormatUint(n, 10)
	}
	switch h {
	case "", "localhost":
		h = "127.0.0.1"
	default:
		if a, err := netip.ParseAddr(h); err == nil {
			a = a.Unmap()
			if a.IsUnspecified() {
				if a.Is4() {
					a = netip.AddrFrom4([4]byte{127, 0, 0, 1})
				} else {
					a = netip.IPv6Loopback()
				}
			}
			h = a.String()
		}
	}
	if strings.Contains(h, ":") {
		return "[" + h + "]:" + port
	}
	return h + ":" + port
}
