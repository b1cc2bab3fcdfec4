package main

// Ollama's own guards, kept at its address (STYLE 26, FIELD_NOTES §10).
//
// Read in Ollama v0.34.4 (server/routes.go: allowedHostsMiddleware,
// allowedHost, isLocalIP and the CORS set-up of GenerateRoutes;
// envconfig/config.go: AllowedOrigins, Var) and in the gin-contrib/cors
// v1.7.2 it uses (cors.go: applyCors, validateOrigin,
// validateWildcardOrigin; config.go: Validate, parseWildcardRules;
// utils.go: normalize). v0.6.5 has the same code and the same cors
// version, so every server version the project tests answers alike.
//
// What Ollama does, and so what the gate does first on every route, its
// own and forwarded ones:
//
//   - CORS (runs first): a request with an Origin header that is neither
//     "http://"+Host nor "https://"+Host (a same-origin request) must have
//     an allowed origin, else 403 with no body. The allowed origins are
//     OLLAMA_ORIGINS (split on commas, after the value's outer spaces and
//     quotes are trimmed), then http and https of localhost, 127.0.0.1 and
//     0.0.0.0 with and without any port, then app://*, file://*, tauri://*,
//     vscode-webview://* and vscode-file://*. An origin matches an entry
//     exactly (the entry trimmed and lower-cased), or the entry's one "*"
//     as a wildcard; an entry "*" allows every origin. An entry with no "*"
//     and no http://, https:// or browser-extension scheme, or with two
//     "*", makes Ollama panic at start: the gate refuses to start on it.
//     An allowed cross-origin OPTIONS is a preflight, answered 204 before
//     the Host check (the gate forwards it: Ollama answers it).
//   - Hosts (DNS rebinding), only when the listener is a loopback address:
//     the Host, without its port, must be an IP address that is loopback,
//     private, unspecified or one of this machine's interfaces', or empty,
//     "localhost", this machine's hostname, or a name under .localhost,
//     .local or .internal; else 403 with no body.
//   - An allowed cross-origin request's answer carries
//     Access-Control-Allow-Origin (and Vary: Origin): the gate adds them to
//     the answers it writes itself (corsWriter); Ollama's are forwarded.
//
// A remote gate's bearer token is checked after these, on every request
// but a browser's preflight (which carries no credential by design).
//
// What the gate forwards so that Ollama's own checks still see what they
// need: the Origin header unchanged (Ollama applies its own allow-list
// again and adds its CORS reply headers), and, when both the gate and the
// upstream listen on loopback, the client's Host (Ollama's Host check
// and its same-origin test see the name the client used, not the
// upstream's address, which would pass every check). When the gate
// listens for other machines, or the upstream is not on loopback, Ollama
// at the gate's address would not check the Host: the request goes with
// the upstream's own Host, and an Origin the gate let pass only because
// it is the client's Host (same-origin) is dropped, since Ollama would
// now read it as cross-origin. The bearer token of a gate that has one
// (-token-file, VRAMGATE_TOKEN) is the gate's credential: it is not
// forwarded.

import (
	"crypto/sha256"
	"crypto/subtle"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
)

// corsSchemes are the schemes an origin entry without a "*" may have:
// cors.DefaultSchemas and, as Ollama sets AllowBrowserExtensions,
// cors.ExtensionSchemas.
var corsSchemes = []string{"http://", "https://", "chrome-extension://", "safari-extension://", "moz-extension://", "ms-browser-extension://"}

// origins is Ollama's origin allow-list, as gin-contrib/cors holds it.
type origins struct {
	all      bool       // an entry "*"
	exact    []string   // every entry, trimmed and lower-cased
	wildcard [][]string // each entry with a "*": {before, after}, "*" for an empty side at an end
}

// ollamaOrigins builds the allow-list from OLLAMA_ORIGINS as Ollama does,
// or says why Ollama would not start with it.
func ollamaOrigins(env string) (*origins, error) {
	var list []string
	if s := strings.Trim(strings.TrimSpace(env), "\"'"); s != "" {
		list = strings.Split(s, ",")
	}
	for _, o := range []string{"localhost", "127.0.0.1", "0.0.0.0"} {
		list = append(list, "http://"+o, "https://"+o, "http://"+net.JoinHostPort(o, "*"), "https://"+net.JoinHostPort(o, "*"))
	}
	list = append(list, "app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")
	o := &origins{}
	seen := map[string]bool{}
	for _, e := range list {
		hasScheme := false
		for _, s := range corsSchemes {
			hasScheme = hasScheme || strings.HasPrefix(e, s)
		}
		if !strings.Contains(e, "*") && !hasScheme {
			return nil, usage("OLLAMA_ORIGINS entry %q: an origin must contain '*' or begin with one of %s (Ollama does not start with it either)", e, strings.Join(corsSchemes, ", "))
		}
		if e == "*" {
			o.all = true
		}
		if n := strings.TrimSpace(strings.ToLower(e)); !seen[n] {
			seen[n] = true
			o.exact = append(o.exact, n)
		}
		switch i := strings.Index(e, "*"); {
		case i < 0:
		case strings.Count(e, "*") > 1:
			return nil, usage("OLLAMA_ORIGINS entry %q: only one * is allowed (Ollama does not start with it either)", e)
		case i == 0:
			o.wildcard = append(o.wildcard, []string{"*", e[1:]})
		case i == len(e)-1:
			o.wildcard = append(o.wildcard, []string{e[:i], "*"})
		default:
			o.wildcard = append(o.wildcard, []string{e[:i], e[i+1:]})
		}
	}
	return o, nil
}

// allows is cors.validateOrigin: the origin as sent (not lower-cased)
// against the list.
func (o *origins) allows(origin string) bool {
	if o.all {
		return true
	}
	for _, e := range o.exact {
		if e == origin {
			return true
		}
	}
	for _, w := range o.wildcard {
		if w[0] == "*" && strings.HasSuffix(origin, w[1]) ||
			w[1] == "*" && strings.HasPrefix(origin, w[0]) ||
			strings.HasPrefix(origin, w[0]) && strings.HasSuffix(origin, w[1]) {
			return true
		}
	}
	return false
}

// sameOrigin is cors.applyCors's test of a request that is not
// cross-origin although it carries an Origin (fetch sends one).
func sameOrigin(origin, host string) bool {
	return origin == "http://"+host || origin == "https://"+host
}

// isLoopbackAddr says whether a listener's address ("host:port") is a
// loopback one, as Ollama's netip.ParseAddrPort(addr).Addr().IsLoopback().
func isLoopbackAddr(addr string) bool {
	ap, err := netip.ParseAddrPort(addr)
	return err == nil && ap.Addr().IsLoopback()
}

// allowedHost is Ollama's allowedHost: a name that cannot be another
// machine's.
func allowedHost(host string) bool {
	host = strings.ToLower(host)
	if host == "" || host == "localhost" {
		return true
	}
	if hostname, err := os.Hostname(); err == nil && host == strings.ToLower(hostname) {
		return true
	}
	for _, tld := range []string{"localhost", "local", "internal"} {
		if strings.HasSuffix(host, "."+tld) {
			return true
		}
	}
	return false
}

// isLocalIP is Ollama's isLocalIP: an address of one of this machine's
// interfaces.
func isLocalIP(ip netip.Addr) bool {
	ifaces, err := net.Interfaces()
	if err != nil {
		return false
	}
	for _, iface := range ifaces {
		addrs, err := iface.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if parsed, _, err := net.ParseCIDR(a.String()); err == nil && parsed.String() == ip.String() {
				return true
			}
		}
	}
	return false
}

// hostAllowed is allowedHostsMiddleware's test for a loopback listener.
func hostAllowed(reqHost string) bool {
	host, _, err := net.SplitHostPort(reqHost)
	if err != nil {
		host = reqHost
	}
	if addr, err := netip.ParseAddr(host); err == nil {
		if addr.IsLoopback() || addr.IsPrivate() || addr.IsUnspecified() || isLocalIP(addr) {
			return true
		}
	}
	return allowedHost(host)
}

// guard is what the gate checks before any route: Ollama's guards, then
// the bearer token of a gate that has one.
type guard struct {
	origins  *origins
	loopback bool     // the listener is a loopback address: Host is checked
	token    [32]byte // SHA-256 of the token; unused when !hasToken
	hasToken bool
}

// refusedByOllamasGuards says whether Ollama at the gate's address would
// answer r 403.
func (gd *guard) refusedByOllamasGuards(r *http.Request) bool {
	if origin := r.Header.Get("Origin"); origin != "" && !sameOrigin(origin, r.Host) {
		if !gd.origins.allows(origin) {
			return true
		}
		if r.Method == http.MethodOptions {
			return false // a preflight: cors answers it before the Host check
		}
	}
	return gd.loopback && !hostAllowed(r.Host)
}

// authorized says whether r carries the gate's token (always, when the
// gate needs none). The comparison takes the same time whatever the
// token sent: both sides are hashed to one length first.
func (gd *guard) authorized(r *http.Request) bool {
	if !gd.hasToken {
		return true
	}
	scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	return subtle.ConstantTimeCompare(sum[:], gd.token[:]) == 1
}

// isPreflight says whether r is a browser's CORS preflight (an OPTIONS
// with an Origin and Access-Control-Request-Method), which never carries
// credentials: one from an allowed origin goes to Ollama, whose CORS
// middleware answers it (204 and its Access-Control-* headers) before any
// route, so that a web page of an allowed origin can then send its
// request with the token.
func isPreflight(r *http.Request) bool {
	return r.Method == http.MethodOptions && r.Header.Get("Origin") != "" && r.Header.Get("Access-Control-Request-Method") != ""
}

// wrap puts the guard in front of h.
func (gd *guard) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if gd.refusedByOllamasGuards(r) {
			// Ollama's answer: c.AbortWithStatus(403), no body.
			w.WriteHeader(http.StatusForbidden)
			return
		}
		if !gd.authorized(r) && !isPreflight(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="vramgate"`)
			// "status" is what Ollama's Go client shows of a 401
			// (api.AuthorizationError keeps no error text).
			msg := "vramgate: this gate needs its token: send the header Authorization: Bearer TOKEN (the token of vramgate -token-file or VRAMGATE_TOKEN)"
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": msg, "status": "401 Unauthorized: " + msg})
			return
		}
		if gd.hasToken {
			r.Header.Del("Authorization") // the gate's credential, not Ollama's
		}
		if origin := r.Header.Get("Origin"); origin != "" && r.Method != http.MethodOptions && !sameOrigin(origin, r.Host) {
			if gd.origins.all {
				origin = "*"
			}
			w = &corsWriter{ResponseWriter: w, origin: origin}
		}
		h.ServeHTTP(w, r)
	})
}

// minTokenLen is the shortest token the gate accepts: 128 bits as hex.
const minTokenLen = 32

// readToken reads the gate's bearer token from the file -token-file names
// or, without it, from VRAMGATE_TOKEN; "" when neither gives one. A file
// others may read is refused, as is a token shorter than minTokenLen.
// The token itself is never in an error.
func readToken(file, env string) (string, error) {
	if file != "" && env != "" {
		return "", usage("both -token-file and VRAMGATE_TOKEN are set: give the token one way")
	}
	tok := env
	if file != "" {
		fi, err := os.Stat(file)
		if err != nil {
			return "", usage("-token-file: %v", err)
		}
		if fi.Mode().Perm()&0o007 != 0 {
			return "", usage("-token-file %s has mode %04o: other users may read it (chmod o-rwx)", file, fi.Mode().Perm())
		}
		b, err := os.ReadFile(file)
		if err != nil {
			return "", usage("-token-file: %v", err)
		}
		tok = string(b)
		if tok = strings.TrimSpace(tok); tok == "" {
			return "", usage("-token-file %s is empty", file)
		}
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return "", nil
	}
	if len(tok) < minTokenLen || strings.ContainsFunc(tok, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return "", usage("the token (-token-file or VRAMGATE_TOKEN) must be %d or more printable characters with no spaces (for example: head -c 32 /dev/urandom | xxd -p -c 64)", minTokenLen)
	}
	return tok, nil
}

// newGuard builds the guard for a listener at addr.
func newGuard(addr, originsEnv, token string) (*guard, error) {
	o, err := ollamaOrigins(originsEnv)
	if err != nil {
		return nil, err
	}
	gd := &guard{origins: o, loopback: isLoopbackAddr(addr)}
	if !gd.loopback && token == "" {
		return nil, usage("the gate at %s is reachable from other machines and has no token: give -token-file FILE or VRAMGATE_TOKEN (clients then send Authorization: Bearer TOKEN)", addr)
	}
	if token != "" {
		gd.token, gd.hasToken = sha256.Sum256([]byte(token)), true
	}
	return gd, nil
}

// isLoopbackName says whether an upstream's host name is a loopback one:
// "localhost" or a loopback address.
func isLoopbackName(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.IsLoopback()
}

// corsWriter gives the answers the gate writes itself the CORS reply
// headers Ollama gives an allowed cross-origin request (cors.handleNormal
// and applyCors: Access-Control-Allow-Origin, the origin or "*" when
// OLLAMA_ORIGINS has "*", and Vary: Origin otherwise), so that a web page
// of an allowed origin can read them (a refusal's 503 included). A
// forwarded reply already has Ollama's own: nothing is added to it.
type corsWriter struct {
	http.ResponseWriter
	origin string
	done   bool
}

func (c *corsWriter) addHeaders() {
	if c.done {
		return
	}
	c.done = true
	h := c.Header()
	if h.Get("Access-Control-Allow-Origin") != "" {
		return
	}
	h.Set("Access-Control-Allow-Origin", c.origin)
	if c.origin != "*" {
		h.Add("Vary", "Origin")
	}
}

func (c *corsWriter) WriteHeader(code int) {
	c.addHeaders()
	c.ResponseWriter.WriteHeader(code)
}

func (c *corsWriter) Write(b []byte) (int, error) {
	c.addHeaders()
	return c.ResponseWriter.Write(b)
}

// Flush and Unwrap keep the reverse proxy's flushes reaching the client.
func (c *corsWriter) Flush() {
	c.addHeaders()
	_ = http.NewResponseController(c.ResponseWriter).Flush()
}

func (c *corsWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }
