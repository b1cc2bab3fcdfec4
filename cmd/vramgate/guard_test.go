package main

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ollama/ollama/api"

	"github.com/vramguard/vramguard/vramguardtest"
)

// recorder is an upstream in front of the simulator that remembers the
// Host and Origin of every request the gate forwards.
type recorder struct {
	*httptest.Server
	mu   sync.Mutex
	seen []seenRequest
}

type seenRequest struct{ method, path, host, origin, auth string }

func newRecorder(t *testing.T, sim *vramguardtest.Server) *recorder {
	t.Helper()
	rec := &recorder{}
	proxy := httputil.NewSingleHostReverseProxy(sim.URL())
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.mu.Lock()
		rec.seen = append(rec.seen, seenRequest{r.Method, r.URL.Path, r.Host, r.Header.Get("Origin"), r.Header.Get("Authorization")})
		rec.mu.Unlock()
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(rec.Close)
	return rec
}

// with lists the requests that reached the upstream with host or origin.
func (rec *recorder) with(host, origin string) []seenRequest {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var out []seenRequest
	for _, s := range rec.seen {
		if host != "" && s.host == host || origin != "" && s.origin == origin {
			out = append(out, s)
		}
	}
	return out
}

// guardedRoutes is every kind of route the gate answers: its own, and
// those it forwards (admitted or passed through).
var guardedRoutes = []struct{ method, path, body string }{
	{"POST", "/vramgate/leases", `{"model":"tiny","holder":"page","ttl":"10m"}`},
	{"GET", "/vramgate/leases", ``},
	{"DELETE", "/vramgate/leases/0123456789abcdef0123456789abcdef", ``},
	{"GET", "/vramgate/can-load?model=small", ``},
	{"POST", "/vramgate/reservations", `{"device":0,"bytes":1024,"for":"page","holder":"page","make_room":true}`},
	{"GET", "/vramgate/reservations", ``},
	{"POST", "/vramgate/reservations/0123456789abcdef0123456789abcdef", `{"ttl":"10m"}`},
	{"DELETE", "/vramgate/reservations/0123456789abcdef0123456789abcdef", ``},
	{"POST", "/api/unload", `{"all":true}`},
	{"POST", "/api/generate", `{"model":"tiny","keep_alive":0}`},
	{"POST", "/api/chat", `{"model":"tiny","keep_alive":0}`},
	{"POST", "/api/generate", `{"model":"small","prompt":"hi","stream":false}`},
	{"POST", "/api/embed", `{"model":"small","input":"hi"}`},
	{"POST", "/v1/chat/completions", `{"model":"small","messages":[{"role":"user","content":"hi"}]}`},
	{"POST", "/api/show", `{"model":"tiny"}`},
	{"DELETE", "/api/delete", `{"model":"tiny"}`},
	{"GET", "/api/tags", ``},
	{"GET", "/api/ps", ``},
	{"GET", "/api/version", ``},
	{"GET", "/", ``},
	{"GET", "/metrics", ``},
	{"GET", "/ready", ``},
}

// send is one request with the header pairs; req.Host is set from "Host".
func send(t *testing.T, method, u, body string, hdr ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// A web page's text/plain POST from a foreign origin, and a request that
// names a foreign host (DNS rebinding), are refused 403 with no body, as
// Ollama answers them, on every route; nothing reaches the server, no
// lease is taken, nothing is unloaded. The same requests from an allowed
// origin and a loopback name are not refused (else the test proves
// nothing).
func TestOllamasGuardsOnEveryRoute(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	rec := newRecorder(t, sim)
	g := startGate(t, rec.URL, nil)
	load(t, sim.APIClient(), "tiny")
	port := g.URL[strings.LastIndex(g.URL, ":")+1:]
	for _, attack := range []struct {
		name string
		hdr  []string
	}{
		{"cross-origin", []string{"Origin", "http://evil.example", "Content-Type", "text/plain"}},
		{"rebinding", []string{"Host", "evil.example:" + port, "Content-Type", "text/plain"}},
		{"rebinding, Ollama's port", []string{"Host", "evil.example:11434", "Content-Type", "text/plain"}},
		{"rebinding with its own origin", []string{"Host", "evil.example:" + port, "Origin", "http://evil.example:" + port}},
		{"public address", []string{"Host", "8.8.8.8:" + port}},
	} {
		t.Run(attack.name, func(t *testing.T) {
			for _, rt := range guardedRoutes {
				code, _, body := send(t, rt.method, g.URL+rt.path, rt.body, attack.hdr...)
				if code != http.StatusForbidden || body != "" {
					t.Errorf("%s %s: %d %q, want 403 with no body (Ollama's answer)", rt.method, rt.path, code, body)
				}
			}
		})
	}
	if got := append(append(rec.with("evil.example:"+port, "http://evil.example"), rec.with("8.8.8.8:"+port, "http://evil.example:"+port)...), rec.with("evil.example:11434", "")...); len(got) > 0 {
		t.Fatalf("refused requests reached the server: %+v", got)
	}
	if !sim.Listed("tiny") || sim.Listed("small") || sim.Requests("small") != 0 {
		t.Fatalf("a refused request changed the server: tiny listed %v, small listed %v (%d requests)", sim.Listed("tiny"), sim.Listed("small"), sim.Requests("small"))
	}
	if _, _, body := send(t, "GET", g.URL+"/vramgate/leases", ""); !strings.Contains(body, `"leases":[]`) {
		t.Fatalf("a refused request took a lease: %s", body)
	}
	// Allowed: Ollama's default origins (any port of localhost), an app's
	// scheme, loopback and local names.
	for _, ok := range [][]string{
		{"Origin", "http://localhost:3000"},
		{"Origin", "app://chat"},
		{"Host", "localhost:" + port},
		{"Host", "box.local:" + port, "Origin", "https://127.0.0.1:8443"},
	} {
		for _, rt := range guardedRoutes[1:4] { // no lease, no load: reads only
			if code, _, body := send(t, rt.method, g.URL+rt.path, rt.body, ok...); code == http.StatusForbidden {
				t.Errorf("%v: %s %s refused: %q", ok, rt.method, rt.path, body)
			}
		}
		if code, _, body := send(t, "GET", g.URL+"/api/tags", "", ok...); code != http.StatusOK {
			t.Errorf("%v: GET /api/tags: %d %s", ok, code, body)
		}
	}
}

// OLLAMA_ORIGINS is honoured as Ollama honours it: an origin it names is
// served, others are still refused, the defaults still hold; an entry
// Ollama would not start with stops the gate's start.
func TestOllamaOrigins(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGateEnv(t, map[string]string{"OLLAMA_ORIGINS": ` "http://evil.example,https://*.corp.example" `}, sim.URL().String(), nil)
	for _, tc := range []struct {
		origin string
		code   int
	}{
		{"http://evil.example", 200},
		{"https://chat.corp.example", 200},
		{"http://localhost:8080", 200},
		{"http://other.example", 403},
		{"http://evil.example.attacker.net", 403},
		{"https://corp.example.attacker.net", 403},
	} {
		if code, _, body := send(t, "GET", g.URL+"/vramgate/leases", "", "Origin", tc.origin); code != tc.code {
			t.Errorf("Origin %s: %d %s, want %d", tc.origin, code, body, tc.code)
		}
		if code, _, _ := send(t, "GET", g.URL+"/api/tags", "", "Origin", tc.origin); code != tc.code {
			t.Errorf("Origin %s, forwarded: %d, want %d", tc.origin, code, tc.code)
		}
	}
	for _, bad := range []string{"evil.example", "http://a.example,", "http://*.a.*"} {
		var stderr syncBuffer
		c := &cmd{stdout: io.Discard, stderr: &stderr, getenv: func(k string) string {
			if k == "OLLAMA_ORIGINS" {
				return bad
			}
			return ""
		}, ready: func(string) { t.Error("the gate listened") }}
		if code := c.main(t.Context(), []string{"-listen", "127.0.0.1:0", "-ollama", sim.URL().String(), "-gpu=false"}); code != 2 || !strings.Contains(stderr.String(), "OLLAMA_ORIGINS entry") {
			t.Errorf("OLLAMA_ORIGINS=%q: exit %d, %s", bad, code, stderr.String())
		}
	}
}

// The table of Ollama's rules (v0.34.4 allowedHost, isLocalIP,
// AllowedOrigins with gin-contrib/cors v1.7.2).
func TestGuardRules(t *testing.T) {
	o, err := ollamaOrigins("")
	if err != nil {
		t.Fatal(err)
	}
	for origin, want := range map[string]bool{
		"http://localhost": true, "https://localhost:1": true, "http://127.0.0.1:11434": true, "http://0.0.0.0:80": true,
		"app://x": true, "file://": true, "tauri://localhost": true, "vscode-webview://abc": true, "vscode-file://a": true,
		"http://LOCALHOST":              false, // the origin is compared as sent, the list lower-cased
		"http://localhost.evil.example": false, "http://evil.example": false, "chrome-extension://abc": false,
		"null": false, "http://127.0.0.2": false,
	} {
		if got := o.allows(origin); got != want {
			t.Errorf("origin %q allowed %v, want %v", origin, got, want)
		}
	}
	hostname, _ := os.Hostname()
	for host, want := range map[string]bool{
		"": true, "localhost": true, "localhost:11434": true, "LOCALHOST:1": true, "127.0.0.1:11434": true, "[::1]:11434": true,
		"10.1.2.3:11434": true, "192.168.0.9": true, "0.0.0.0:1": true, "a.localhost": true, "box.local:1": true, "x.internal": true,
		hostname:             true,
		"evil.example:11434": false, "8.8.8.8:11434": false, "localhost.evil.example": false, "internal": false,
	} {
		if got := hostAllowed(host); got != want {
			t.Errorf("Host %q allowed %v, want %v", host, got, want)
		}
	}
	for addr, want := range map[string]bool{"127.0.0.1:11434": true, "[::1]:1": true, "0.0.0.0:11434": false, "192.168.1.2:1": false} {
		if got := isLoopbackAddr(addr); got != want {
			t.Errorf("listener %s loopback %v, want %v", addr, got, want)
		}
	}
	if !isLocalIP(netip.MustParseAddr("127.0.0.1")) {
		t.Error("127.0.0.1 is not one of this machine's addresses")
	}
}

// Forwarding keeps what Ollama's own checks need: on loopback the
// client's Host and Origin reach Ollama as sent (its Host check and its
// allow-list see what the client sent, not the gate's address).
func TestForwardedHostAndOrigin(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	rec := newRecorder(t, sim)
	g := startGate(t, rec.URL, nil)
	port := g.URL[strings.LastIndex(g.URL, ":")+1:]
	if code, _, body := send(t, "GET", g.URL+"/api/tags", "", "Host", "localhost:"+port, "Origin", "http://localhost:3000"); code != 200 {
		t.Fatalf("GET /api/tags: %d %s", code, body)
	}
	got := rec.with("localhost:"+port, "")
	if len(got) != 1 || got[0].path != "/api/tags" || got[0].origin != "http://localhost:3000" {
		u, _ := url.Parse(rec.URL)
		t.Fatalf("the forwarded request reached Ollama as %+v; want Host localhost:%s (not %s) and the Origin as sent", got, port, u.Host)
	}
}

// testToken is a token of the accepted length.
const testToken = "0123456789abcdef0123456789abcdef-test"

// tokenFile writes tok to a file of mode perm.
func tokenFile(t *testing.T, tok string, perm os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(p, []byte(tok+"\n"), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, perm); err != nil { // past the umask
		t.Fatal(err)
	}
	return p
}

// A gate other machines can reach needs its token: without it, or with
// a wrong one, 401 on every route (own and forwarded) and nothing reaches
// the server; with it, served, and the token is not forwarded to Ollama
// nor written to the log. Ollama's origin check still holds there.
func TestRemoteNeedsItsToken(t *testing.T) {
	for _, how := range []string{"file", "env"} {
		t.Run(how, func(t *testing.T) {
			sim := newSim(t, vramguardtest.Config{})
			rec := newRecorder(t, sim)
			args, env := []string{"-listen", "0.0.0.0:0", "-allow-remote", "-v"}, map[string]string(nil)
			if how == "file" {
				args = append(args, "-token-file", tokenFile(t, testToken, 0o600))
			} else {
				env = map[string]string{"VRAMGATE_TOKEN": testToken}
			}
			g := startGateEnv(t, env, rec.URL, nil, args...)
			base := strings.Replace(g.URL, "0.0.0.0", "127.0.0.1", 1)
			for _, auth := range []string{"", "Bearer wrong", "Bearer " + testToken + "x", "Basic " + testToken, testToken} {
				for _, rt := range guardedRoutes {
					code, hdr, body := send(t, rt.method, base+rt.path, rt.body, "Authorization", auth)
					if code != http.StatusUnauthorized || !strings.Contains(body, "Authorization: Bearer TOKEN") || hdr.Get("WWW-Authenticate") == "" {
						t.Errorf("Authorization %q: %s %s: %d %s, want 401", auth, rt.method, rt.path, code, body)
					}
				}
			}
			rec.mu.Lock()
			reached := len(rec.seen)
			rec.mu.Unlock()
			if reached != 1 { // the gate's own look at start (/api/ps)
				t.Fatalf("%d requests reached the server, want only the gate's start-up look: %+v", reached, rec.seen)
			}
			for _, auth := range []string{"Bearer " + testToken, "bearer  " + testToken} {
				if code, _, body := send(t, "GET", base+"/api/tags", "", "Authorization", auth); code != http.StatusOK {
					t.Fatalf("with the token (%q): %d %s", auth[:7], code, body)
				}
				if code, _, body := send(t, "GET", base+"/vramgate/leases", "", "Authorization", auth); code != http.StatusOK {
					t.Fatalf("with the token, own route: %d %s", code, body)
				}
			}
			// A browser's preflight carries no credential: from an allowed
			// origin it reaches Ollama, which answers it; from a foreign one
			// it is refused as Ollama refuses it.
			pre := []string{"Origin", "http://localhost:3000", "Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "authorization,content-type"}
			if code, _, body := send(t, "OPTIONS", base+"/api/chat", "", pre...); code == http.StatusUnauthorized || code == http.StatusForbidden || len(rec.with("", "http://localhost:3000")) != 1 {
				t.Errorf("preflight from an allowed origin: %d %s, want it forwarded to Ollama (the integration suite checks Ollama's 204)", code, body)
			}
			pre[1] = "http://evil.example"
			if code, _, _ := send(t, "OPTIONS", base+"/api/chat", "", pre...); code != http.StatusForbidden {
				t.Errorf("preflight from a foreign origin: %d, want 403", code)
			}
			// Ollama's origin check holds with the token too; the Host check
			// is off on a non-loopback listener, as Ollama's is.
			if code, _, _ := send(t, "GET", base+"/api/tags", "", "Authorization", "Bearer "+testToken, "Origin", "http://evil.example"); code != http.StatusForbidden {
				t.Errorf("a foreign origin with the token: %d, want 403", code)
			}
			if code, _, _ := send(t, "GET", base+"/api/tags", "", "Authorization", "Bearer "+testToken, "Host", "gpu-box.example.com:11434"); code != http.StatusOK {
				t.Errorf("a remote gate's own name as Host: %d, want 200", code)
			}
			rec.mu.Lock()
			for _, s := range rec.seen {
				if s.auth != "" {
					t.Errorf("the token reached Ollama: %+v", s)
				}
			}
			rec.mu.Unlock()
			if g.stop(t) != 0 || strings.Contains(g.Stderr.String(), testToken[:16]) {
				t.Fatalf("the token is in the log:\n%s", g.Stderr)
			}
		})
	}
}

// Loopback stays token-free by default (every other test of the gate);
// a token given on loopback is required there too.
func TestTokenOnLoopback(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGateEnv(t, map[string]string{"VRAMGATE_TOKEN": testToken}, sim.URL().String(), nil)
	if code, _, _ := send(t, "GET", g.URL+"/api/tags", ""); code != http.StatusUnauthorized {
		t.Fatalf("without the token: %d, want 401", code)
	}
	if code, _, _ := send(t, "GET", g.URL+"/api/tags", "", "Authorization", "Bearer "+testToken); code != http.StatusOK {
		t.Fatalf("with the token: %d, want 200", code)
	}
}

// A token the gate cannot trust stops the start, with the reason and not
// the token.
func TestBadToken(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	for _, tc := range []struct {
		name string
		args []string
		env  string
		want string
	}{
		{"file others may read", []string{"-token-file", tokenFile(t, testToken, 0o644)}, "", "other users may read it"},
		{"short", []string{"-token-file", tokenFile(t, "short", 0o600)}, "", "32 or more printable"},
		{"empty file", []string{"-token-file", tokenFile(t, "", 0o600)}, "", "is empty"},
		{"no such file", []string{"-token-file", "/nonexistent/token"}, "", "no such file"},
		{"both", []string{"-token-file", tokenFile(t, testToken, 0o600)}, testToken, "give the token one way"},
		{"spaces", nil, "0123456789abcdef 0123456789abcdef", "no spaces"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr syncBuffer
			c := &cmd{stdout: io.Discard, stderr: &stderr, getenv: func(k string) string {
				if k == "VRAMGATE_TOKEN" {
					return tc.env
				}
				return ""
			}, ready: func(string) { t.Error("the gate listened") }}
			args := append([]string{"-listen", "0.0.0.0:0", "-allow-remote", "-ollama", sim.URL().String(), "-gpu=false"}, tc.args...)
			code := c.main(t.Context(), args)
			if code != 2 || !strings.Contains(stderr.String(), tc.want) || strings.Contains(stderr.String(), "0123456789abcdef") {
				t.Fatalf("exit %d, stderr %q; want 2 saying %q, without the token", code, stderr.String(), tc.want)
			}
		})
	}
}

// bearer is the RoundTripper the README shows: Ollama's Go client sends
// the gate's token through it.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// Ollama's own Go client reaches a remote gate with the token added by
// its http.Client (as the README shows), and without it gets the 401 as
// an error that says what to send.
func TestOllamaClientSendsTheToken(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGateEnv(t, map[string]string{"VRAMGATE_TOKEN": testToken}, sim.URL().String(), nil, "-listen", "0.0.0.0:0", "-allow-remote")
	u, err := url.Parse(strings.Replace(g.URL, "0.0.0.0", "127.0.0.1", 1))
	if err != nil {
		t.Fatal(err)
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(tr.CloseIdleConnections)
	with := api.NewClient(u, &http.Client{Transport: bearer{testToken, tr}})
	if tags, err := with.List(t.Context()); err != nil || len(tags.Models) != 2 {
		t.Fatalf("List with the token: %+v, %v", tags, err)
	}
	load(t, with, "tiny")
	without := api.NewClient(u, &http.Client{Transport: tr})
	_, err = without.List(t.Context())
	var ae api.AuthorizationError
	if !errors.As(err, &ae) || ae.StatusCode != 401 || !strings.Contains(err.Error(), "Authorization: Bearer TOKEN") {
		t.Fatalf("List without the token: %v, want a 401 that says what to send", err)
	}
	err = without.Generate(t.Context(), &api.GenerateRequest{Model: "tiny", Prompt: "hi"}, func(api.GenerateResponse) error { return nil })
	if !errors.As(err, &ae) || ae.StatusCode != 401 {
		t.Fatalf("Generate without the token: %v, want a 401", err)
	}
	t.Logf("Ollama's client without the token: %v", err)
}

// An allowed cross-origin request gets Ollama's CORS reply headers on the
// gate's own answers (a refusal included), once; a request without an
// Origin gets none.
func TestCORSHeadersOnOwnAnswers(t *testing.T) {
	sim := newSim(t, vramguardtest.Config{})
	g := startGate(t, sim.URL().String(), nil, "-max-loaded", "1")
	load(t, sim.APIClient(), "tiny")
	if code, _, body := send(t, "POST", g.URL+"/vramgate/leases", `{"model":"tiny","holder":"h"}`); code != 201 {
		t.Fatalf("lease: %d %s", code, body)
	}
	for _, rt := range []struct{ method, path, body string }{
		{"GET", "/vramgate/leases", ""},
		{"POST", "/api/generate", `{"model":"small","prompt":"hi"}`}, // refused: 503
		{"GET", "/metrics", ""},
	} {
		_, hdr, _ := send(t, rt.method, g.URL+rt.path, rt.body, "Origin", "app://chat")
		if got := hdr.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != "app://chat" || hdr.Get("Vary") != "Origin" {
			t.Errorf("%s %s from app://chat: Access-Control-Allow-Origin %q, Vary %q; want app://chat once, Vary Origin", rt.method, rt.path, got, hdr.Get("Vary"))
		}
		if _, hdr, _ := send(t, rt.method, g.URL+rt.path, rt.body); hdr.Get("Access-Control-Allow-Origin") != "" {
			t.Errorf("%s %s without an Origin: Access-Control-Allow-Origin %q", rt.method, rt.path, hdr.Get("Access-Control-Allow-Origin"))
		}
	}
}

// The guard reads untrusted headers: it never panics; a request it lets
// through with an Origin has an allowed or same-origin one, and on a
// loopback listener an allowed Host.
func FuzzGuard(f *testing.F) {
	for _, s := range [][2]string{{"http://evil.example", "127.0.0.1:11434"}, {"", "evil.example:11434"}, {"app://x", "[::1]:1"}, {"http://a:1", "a:1"}, {"null", ""}, {"http://localhost:*", "localhost:"}} {
		f.Add(s[0], s[1], "GET")
	}
	gd, err := newGuard("127.0.0.1:11434", "http://*.corp.example", "")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, origin, host, method string) {
		r := &http.Request{Method: method, Host: host, Header: http.Header{}}
		if origin != "" {
			r.Header.Set("Origin", origin)
		}
		if gd.refusedByOllamasGuards(r) {
			return
		}
		if origin != "" && !sameOrigin(origin, host) && !gd.origins.allows(origin) {
			t.Fatalf("Origin %q with Host %q let through", origin, host)
		}
		if (origin == "" || method != http.MethodOptions) && !hostAllowed(host) {
			t.Fatalf("Host %q let through on loopback (Origin %q, %s)", host, origin, method)
		}
	})
}
