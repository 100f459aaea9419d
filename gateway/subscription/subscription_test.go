package subscription

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/net/dns/dnsmessage"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/tests/await"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const root = "/v1/stream/"

// harness runs a Manager over a fake StreamService behind an httptest server.
type harness struct {
	t    testing.TB
	m    *Manager
	fake *fakeStreams
	srv  *httptest.Server
	stop func()
}

func newHarness(t testing.TB, cfg Config, fake *fakeStreams) *harness {
	t.Helper()
	if fake == nil {
		fake = newFakeStreams()
	}
	if cfg.TickInterval == 0 {
		cfg.TickInterval = 5 * time.Millisecond
	}
	if cfg.AllowWebhookHosts == nil {
		// The tests' webhook receivers are loopback httptest servers,
		// which the default refuses.
		cfg.AllowWebhookHosts = []string{"127.0.0.0/8", "::1", "localhost"}
	}
	m, err := New(cfg, fake, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatalf("new manager: %v", err)
	}
	srv := httptest.NewServer(m)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var once sync.Once
	h := &harness{t: t, m: m, fake: fake, srv: srv}
	h.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
			m.Close()
			srv.Close()
		})
	}
	t.Cleanup(h.stop)
	return h
}

// do sends a request to <root>__ds/<path> and decodes a JSON answer.
func (h *harness) do(method, path string, body any, header ...string) (int, map[string]any) {
	h.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		data, _ := json.Marshal(b)
		rd = bytes.NewReader(data)
	}
	req, _ := http.NewRequest(method, h.srv.URL+root+"__ds/"+path, rd)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if len(data) > 0 {
		_ = json.Unmarshal(data, &out)
	}
	return resp.StatusCode, out
}

// write writes to a family-1 stream and calls the observer hook.
func (h *harness) write(path, body string) {
	if h.fake.write("__ds", path, "application/json", []byte(body)) {
		h.m.StreamCreated(context.Background(), path)
	} else {
		h.m.StreamWritten(context.Background(), path)
	}
}

func (h *harness) tail(path string) string {
	info, _, err := h.m.head(context.Background(), path)
	if err != nil {
		h.t.Fatalf("head %s: %v", path, err)
	}
	return info.GetNextOffset()
}

// receiver is a webhook endpoint recording requests.
type receiver struct {
	srv     *httptest.Server
	mu      sync.Mutex
	got     []received
	respond func(n int) (int, string)
}

type received struct {
	body map[string]any
	raw  []byte
	sig  string
}

func newReceiver(t testing.TB, respond func(n int) (int, string)) *receiver {
	t.Helper()
	r := &receiver{respond: respond}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		raw, _ := io.ReadAll(req.Body)
		var body map[string]any
		_ = json.Unmarshal(raw, &body)
		r.mu.Lock()
		r.got = append(r.got, received{body: body, raw: raw, sig: req.Header.Get("Webhook-Signature")})
		n := len(r.got)
		r.mu.Unlock()
		status, answer := http.StatusOK, "{}"
		if r.respond != nil {
			status, answer = r.respond(n)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, answer)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) url() string { return r.srv.URL + "/webhook" }

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

func (r *receiver) wait(t testing.TB, n int) received {
	t.Helper()
	await.True(t, fmt.Sprintf("%d webhook requests", n), func() bool { return r.count() >= n })
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[n-1]
}

var sigRE = regexp.MustCompile(`^t=(\d+),kid=([^,]+),ed25519=([A-Za-z0-9_-]+)$`)

// verifySignature checks a Webhook-Signature against a JWKS the way the
// conformance suite does.
func verifySignature(raw []byte, header string, jwks map[string]any) error {
	mm := sigRE.FindStringSubmatch(header)
	if mm == nil {
		return fmt.Errorf("malformed signature header %q", header)
	}
	ts, kid, sig := mm[1], mm[2], mm[3]
	for _, k := range jwks["keys"].([]any) {
		key := k.(map[string]any)
		if key["kid"] != kid {
			continue
		}
		if key["kty"] != "OKP" || key["crv"] != "Ed25519" || key["alg"] != "EdDSA" {
			return fmt.Errorf("unexpected key %v", key)
		}
		pub, err := base64.RawURLEncoding.DecodeString(key["x"].(string))
		if err != nil {
			return err
		}
		s, err := base64.RawURLEncoding.DecodeString(sig)
		if err != nil {
			return err
		}
		if !ed25519.Verify(ed25519.PublicKey(pub), []byte(ts+"."+string(raw)), s) {
			return errors.New("bad signature")
		}
		return nil
	}
	return fmt.Errorf("kid %s not in jwks", kid)
}

func streamByPath(t testing.TB, body map[string]any, path string) map[string]any {
	t.Helper()
	for _, s := range body["streams"].([]any) {
		if st := s.(map[string]any); st["path"] == path {
			return st
		}
	}
	t.Fatalf("stream %s not in %v", path, body["streams"])
	return nil
}

func errCode(body map[string]any) errcode.Code {
	e, _ := body["error"].(map[string]any)
	r, _ := e["code"].(string)
	c, _ := errcode.Parse(r)
	return c
}

func TestGlobMatch(t *testing.T) {
	tests := []struct {
		pattern, path string
		want          bool
	}{
		{"events/*", "events/a", true},
		{"events/*", "events/a/b", false},
		{"events/*", "events", false},
		{"events/**", "events", true},
		{"events/**", "events/a/b/c", true},
		{"**/c", "a/b/c", true},
		{"**", "anything/at/all", true},
		{"a/*/c", "a/b/c", true},
		{"a/*/c", "a/b/d", false},
		{"/events/*/", "events/x", true},
		{"lit/%2A", "lit/*", true},
		{"lit/%2A", "lit/x", false},
	}
	for _, tt := range tests {
		t.Run(tt.pattern+"~"+tt.path, func(t *testing.T) {
			if got := globMatch(tt.pattern, tt.path); got != tt.want {
				t.Errorf("globMatch(%q, %q) = %v, want %v", tt.pattern, tt.path, got, tt.want)
			}
		})
	}
}

// TestValidateWebhookURL: by default only https to public hosts is
// accepted; loopback, private, link-local and other special-purpose
// addresses (in every spelling) and this machine's names are refused;
// allow_private_webhooks admits private ranges and http; allow_webhook_hosts
// admits what it lists, over http too.
func TestValidateWebhookURL(t *testing.T) {
	tests := []struct {
		name         string
		url          string
		allowPrivate bool
		allow        []string
		ok           bool
	}{
		{"public https", "https://hooks.example.com/x", false, nil, true},
		{"public http", "http://hooks.example.com/x", false, nil, false},
		{"public http allowed", "http://hooks.example.com/x", true, nil, true},
		{"loopback ip", "http://127.0.0.1:8080/hook", false, nil, false},
		{"loopback ip https", "https://127.0.0.1:8080/hook", false, nil, false},
		{"loopback other", "https://127.1.2.3/hook", false, nil, false},
		{"localhost", "http://localhost:9/hook", false, nil, false},
		{"localhost https", "https://localhost:9/hook", false, nil, false},
		{"localhost subdomain", "https://a.localhost/hook", false, nil, false},
		{"localhost trailing dot", "https://LOCALHOST./hook", false, nil, false},
		{"loopback v6", "https://[::1]/x", false, nil, false},
		{"loopback mapped", "https://[::ffff:127.0.0.1]/x", false, nil, false},
		{"loopback private allowed", "http://127.0.0.1/x", true, nil, false},
		{"localhost listed by name", "http://localhost:9/hook", false, []string{"localhost"}, true},
		{"localhost listed by cidr", "http://localhost:9/hook", false, []string{"127.0.0.0/8"}, true},
		{"loopback listed", "http://127.0.0.1:8080/hook", false, []string{"127.0.0.0/8"}, true},
		{"loopback v6 listed", "http://[::1]:8080/hook", false, []string{"::1"}, true},
		{"loopback not covered", "http://127.0.0.2:8080/hook", false, []string{"127.0.0.1/32"}, false},
		{"rfc1918 10", "http://10.0.0.1/hook", false, nil, false},
		{"rfc1918 https", "https://192.168.1.5/hook", false, nil, false},
		{"rfc1918 172", "https://172.16.3.4/hook", false, nil, false},
		{"rfc1918 allowed", "https://10.0.0.1/hook", true, nil, true},
		{"rfc1918 listed", "http://10.1.2.3/hook", false, []string{"10.1.0.0/16"}, true},
		{"cgnat", "https://100.64.1.1/x", false, nil, false},
		{"cgnat allowed", "https://100.64.1.1/x", true, nil, true},
		{"metadata ip", "https://169.254.169.254/latest", false, nil, false},
		{"metadata ip private allowed", "https://169.254.169.254/latest", true, nil, false},
		{"metadata name", "https://metadata.google.internal/x", false, nil, false},
		{"link-local v6", "https://[fe80::1]/x", false, nil, false},
		{"ula v6", "https://[fd00::1]/x", false, nil, false},
		{"mapped v4", "https://[::ffff:10.0.0.1]/x", false, nil, false},
		{"nat64 of private", "https://[64:ff9b::a00:1]/x", false, nil, false},
		{"6to4 of loopback", "https://[2002:7f00:1::1]/x", false, nil, false},
		{"v4-compatible", "https://[::7f00:1]/x", false, nil, false},
		{"unspecified", "https://0.0.0.0/x", false, nil, false},
		{"unspecified v6", "https://[::]/x", false, nil, false},
		{"multicast", "https://224.0.0.1/x", false, nil, false},
		{"broadcast", "https://255.255.255.255/x", false, nil, false},
		{"public v4", "https://8.8.8.8/x", false, nil, true},
		{"public v6", "https://[2606:4700:4700::1111]/x", false, nil, true},
		{"ftp", "ftp://example.com/x", false, nil, false},
		{"file", "file:///etc/passwd", false, nil, false},
		{"relative", "/hook", false, nil, false},
		{"credentials", "https://u:p@example.com/x", false, nil, false},
		{"garbage", "::", false, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := newAddressPolicy(tt.allowPrivate, tt.allow)
			if err != nil {
				t.Fatal(err)
			}
			err = p.validateWebhookURL(tt.url)
			if (err == nil) != tt.ok {
				t.Errorf("validateWebhookURL(%q) = %v, want ok=%v", tt.url, err, tt.ok)
			}
		})
	}
}

func TestAllowWebhookHostsParse(t *testing.T) {
	for _, bad := range [][]string{{""}, {"10.0.0.0/33"}, {"a b"}, {"host:80"}} {
		if _, err := newAddressPolicy(false, bad); err == nil {
			t.Errorf("allow_webhook_hosts %q accepted", bad)
		}
	}
	if err := (Config{AllowWebhookHosts: []string{"10.0.0.0/33"}}).Validate(); err == nil {
		t.Error("Validate accepted a bad allow_webhook_hosts")
	}
}

func TestWebhookDialerBlocksInternalAddresses(t *testing.T) {
	p, _ := newAddressPolicy(false, nil)
	d := &webhookDialer{policy: p}
	for _, addr := range []string{"10.0.0.1:80", "169.254.169.254:80", "[fe80::1]:443", "metadata.google.internal:80", "127.0.0.1:1", "[::ffff:127.0.0.1]:1", "0.0.0.0:1"} {
		t.Run(addr, func(t *testing.T) {
			_, err := d.DialContext(t.Context(), "tcp", addr)
			if !errors.Is(err, errAddressBlocked) {
				t.Fatalf("dial %s: %v, want errAddressBlocked", addr, err)
			}
		})
	}
}

// TestWebhookDialerChecksDialedAddress: a name is judged by the address
// the dialer actually connects to, whatever it was at subscription time:
// a name a resolver points at loopback (DNS rebinding) is refused, and
// connects once loopback is listed.
func TestWebhookDialerChecksDialedAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	resolver := fakeResolver(t, netip.MustParseAddr("127.0.0.1"))
	for _, tc := range []struct {
		name  string
		host  string
		allow []string
		ok    bool
	}{
		{"rebound name", "hooks.example.test", nil, false},
		{"rebound name, loopback listed", "hooks.example.test", []string{"127.0.0.0/8"}, true},
		{"rebound name listed", "hooks.example.test", []string{"hooks.example.test"}, true},
		{"other name listed", "hooks.example.test", []string{"other.example.test"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := newAddressPolicy(false, tc.allow)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.validateWebhookURL("https://" + tc.host + "/hook"); err != nil {
				t.Fatalf("the name was refused at subscription time: %v", err)
			}
			d := &webhookDialer{dialer: net.Dialer{Resolver: resolver}, policy: p}
			c, err := d.DialContext(t.Context(), "tcp", net.JoinHostPort(tc.host, port))
			if tc.ok {
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				c.Close()
				return
			}
			if !errors.Is(err, errAddressBlocked) {
				t.Fatalf("dial: %v, want errAddressBlocked", err)
			}
		})
	}
}

// fakeResolver is a resolver whose DNS server answers every A question
// with addr and every other question with no records.
func fakeResolver(t *testing.T, addr netip.Addr) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var msg dnsmessage.Message
			if msg.Unpack(buf[:n]) != nil || len(msg.Questions) != 1 {
				continue
			}
			q := msg.Questions[0]
			msg.Header.Response, msg.Header.Authoritative, msg.Header.RCode = true, true, dnsmessage.RCodeSuccess
			if q.Type == dnsmessage.TypeA {
				msg.Answers = []dnsmessage.Resource{{
					Header: dnsmessage.ResourceHeader{Name: q.Name, Type: dnsmessage.TypeA, Class: dnsmessage.ClassINET, TTL: 1},
					Body:   &dnsmessage.AResource{A: addr.As4()},
				}}
			}
			out, err := msg.Pack()
			if err == nil {
				_, _ = pc.WriteTo(out, from)
			}
		}
	}()
	server := pc.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", server)
	}}
}

// TestDefaultRefusesLoopbackWebhooks: with the default configuration a
// webhook subscription to this machine is refused (400
// WEBHOOK_URL_REJECTED), and nothing is stored.
func TestDefaultRefusesLoopbackWebhooks(t *testing.T) {
	fake := newFakeStreams()
	m, err := New(Config{}, fake, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for i, u := range []string{"http://localhost:1/x", "http://127.0.0.1:1/x", "https://[::1]:1/x", "https://169.254.169.254/x"} {
		body, _ := json.Marshal(map[string]any{"type": "webhook", "pattern": "a/*", "webhook": map[string]any{"url": u}})
		req := httptest.NewRequest(http.MethodPut, root+"__ds/subscriptions/s"+fmt.Sprint(i), bytes.NewReader(body))
		rec := httptest.NewRecorder()
		m.ServeHTTP(rec, req)
		if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), "WEBHOOK_URL_REJECTED") {
			t.Errorf("%s: %d %s", u, rec.Code, rec.Body)
		}
	}
	if n := len(m.allSubs()); n != 0 {
		t.Fatalf("%d subscriptions stored", n)
	}
}

// TestSubscriptionLimits: creates and added links past the limits answer
// 429 LIMIT_EXCEEDED and change nothing: subscriptions in all, streams one
// subscription links, subscriptions linking one stream; a delete makes
// room again.
func TestSubscriptionLimits(t *testing.T) {
	h := newHarness(t, Config{MaxSubscriptions: 2, MaxSubscriptionsPerStream: 1, MaxStreamsPerSubscription: 2}, nil)
	create := func(id string, streams ...string) (int, map[string]any) {
		return h.do("PUT", "subscriptions/"+id, map[string]any{
			"type": "webhook", "streams": streams, "webhook": map[string]any{"url": "https://hooks.example.com/x"},
		})
	}
	limited := func(what string, status int, body map[string]any) {
		t.Helper()
		e, _ := body["error"].(map[string]any)
		if status != http.StatusTooManyRequests || e["code"] != "LIMIT_EXCEEDED" {
			t.Fatalf("%s: %d %v, want 429 LIMIT_EXCEEDED", what, status, body)
		}
	}
	if st, b := create("a", "s1"); st != http.StatusCreated {
		t.Fatalf("create a: %d %v", st, b)
	}
	st, b := create("b", "s1")
	limited("a second subscription of s1", st, b)
	st, b = create("b", "s2", "s3", "s4")
	limited("three streams", st, b)
	if st, b := create("b", "s2"); st != http.StatusCreated {
		t.Fatalf("create b: %d %v", st, b)
	}
	st, b = create("c", "s9")
	limited("a third subscription", st, b)
	st, b = h.do("POST", "subscriptions/a/streams", map[string]any{"streams": []string{"s2"}})
	limited("linking s2 twice", st, b)
	if st, b := h.do("POST", "subscriptions/a/streams", map[string]any{"streams": []string{"s3", "s1"}}); st != http.StatusNoContent {
		t.Fatalf("add s3 to a: %d %v", st, b)
	}
	st, b = h.do("POST", "subscriptions/a/streams", map[string]any{"streams": []string{"s5"}})
	limited("a third stream of a", st, b)
	if st, _ := h.do("DELETE", "subscriptions/b", nil); st != http.StatusNoContent {
		t.Fatalf("delete b: %d", st)
	}
	if st, b := create("c", "s2"); st != http.StatusCreated {
		t.Fatalf("create c after the delete: %d %v", st, b)
	}
}

func TestBackoff(t *testing.T) {
	m := &Manager{cfg: DefaultConfig()}
	tests := []struct {
		attempt int
		base    time.Duration
	}{{1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {6, 32 * time.Second}, {7, 60 * time.Second}, {30, 60 * time.Second}}
	for _, tt := range tests {
		t.Run(fmt.Sprint(tt.attempt), func(t *testing.T) {
			for range 50 {
				d := m.backoff(tt.attempt)
				lo, hi := time.Duration(float64(tt.base)*0.8), time.Duration(float64(tt.base)*1.2)
				if d < lo || d > hi {
					t.Fatalf("backoff(%d) = %v, want within [%v, %v]", tt.attempt, d, lo, hi)
				}
			}
		})
	}
}

func TestKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys", "webhook.pem")
	a, err := newSigner(path)
	if err != nil {
		t.Fatalf("create key: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatalf("stat key: %v", err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key mode = %v, want 0600", st.Mode().Perm())
	}
	b, err := newSigner(path)
	if err != nil {
		t.Fatalf("reload key: %v", err)
	}
	if a.kid != b.kid || !strings.HasPrefix(a.kid, "ds_") {
		t.Errorf("kids %q and %q, want equal with ds_ prefix", a.kid, b.kid)
	}
	if err := os.WriteFile(path, []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := newSigner(path); err == nil {
		t.Error("loading a junk key succeeded")
	}
}

func TestTokens(t *testing.T) {
	s, err := newSigner("")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tok := s.issueToken("sub", 3, "w_1", now)
	tests := []struct {
		name  string
		token string
		sub   string
		at    time.Time
		code  errcode.Code
	}{
		{"valid", tok, "sub", now, 0},
		{"other subscription", tok, "other", now, codeTokenInvalid},
		{"expired", tok, "sub", now.Add(2 * tokenTTL), codeTokenExpired},
		{"tampered", tok[:len(tok)-2] + "AA", "sub", now, codeTokenInvalid},
		{"garbage", "abc", "sub", now, codeTokenInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, code := s.verifyToken(tt.token, tt.sub, tt.at)
			if code != tt.code {
				t.Fatalf("code = %v, want %v", code, tt.code)
			}
			if code == 0 && (c.Gen != 3 || c.Wake != "w_1") {
				t.Errorf("claims = %+v", c)
			}
		})
	}
}

func TestCreateConfirmAndJWKS(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	rcv := newReceiver(t, nil)
	spec := map[string]any{
		"type": "webhook", "pattern": "events/*", "webhook": map[string]any{"url": rcv.url()},
		"lease_ttl_ms": 1000, "description": "test subscription",
	}
	status, created := h.do("PUT", "subscriptions/sub-1", spec)
	if status != http.StatusCreated {
		t.Fatalf("create = %d %v", status, created)
	}
	if _, ok := created["webhook_secret"]; ok {
		t.Error("webhook_secret exposed")
	}
	wh := created["webhook"].(map[string]any)
	signing := wh["signing"].(map[string]any)
	if wh["url"] != rcv.url() || signing["alg"] != "ed25519" || !strings.HasPrefix(signing["kid"].(string), "ds_") {
		t.Errorf("webhook = %v", wh)
	}
	if want := h.srv.URL + root + "__ds/jwks.json"; signing["jwks_url"] != want {
		t.Errorf("jwks_url = %v, want %s", signing["jwks_url"], want)
	}

	resp, err := http.Get(signing["jwks_url"].(string))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); !strings.Contains(ct, "application/jwk-set+json") {
		t.Errorf("jwks content type = %q", ct)
	}
	var jwks map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&jwks)
	key := jwks["keys"].([]any)[0].(map[string]any)
	if key["kid"] != signing["kid"] || key["kty"] != "OKP" || key["crv"] != "Ed25519" || key["alg"] != "EdDSA" {
		t.Errorf("jwks key = %v", key)
	}

	tests := []struct {
		name   string
		method string
		body   any
		status int
		code   errcode.Code
	}{
		{"identical re-put", "PUT", spec, http.StatusOK, 0},
		{"different config", "PUT", map[string]any{"type": "webhook", "pattern": "other/*", "webhook": map[string]any{"url": rcv.url()}}, http.StatusConflict, codeAlreadyExists},
		{"get", "GET", nil, http.StatusOK, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := h.do(tt.method, "subscriptions/sub-1", tt.body)
			if status != tt.status || errCode(body) != tt.code {
				t.Fatalf("status %d body %v, want %d %s", status, body, tt.status, tt.code)
			}
			if status == http.StatusOK {
				if body["id"] != "sub-1" || body["subscription_id"] != "sub-1" || body["type"] != "webhook" ||
					body["status"] != "active" || body["description"] != "test subscription" || body["lease_ttl_ms"] != 1000.0 {
					t.Errorf("body = %v", body)
				}
				if _, ok := body["webhook_secret"]; ok {
					t.Error("webhook_secret exposed")
				}
			}
		})
	}

	if status, _ := h.do("DELETE", "subscriptions/sub-1", nil); status != http.StatusNoContent {
		t.Errorf("delete = %d", status)
	}
	if status, _ := h.do("DELETE", "subscriptions/sub-1", nil); status != http.StatusNoContent {
		t.Errorf("second delete = %d", status)
	}
	if status, body := h.do("GET", "subscriptions/sub-1", nil); status != http.StatusNotFound || errCode(body) != codeNotFound {
		t.Errorf("get after delete = %d %v", status, body)
	}
}

func TestRequestValidation(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	h.fake.write("__ds", "wake/bin", "application/octet-stream", []byte("x"))
	tests := []struct {
		name   string
		method string
		path   string
		body   any
		status int
		code   errcode.Code
	}{
		{"unsafe url", "PUT", "subscriptions/s", map[string]any{"type": "webhook", "pattern": "events/*", "webhook": map[string]any{"url": "http://10.0.0.1/hook"}}, 400, codeURLRejected},
		{"metadata url", "PUT", "subscriptions/s", map[string]any{"type": "webhook", "pattern": "e/*", "webhook": map[string]any{"url": "https://169.254.169.254/"}}, 400, codeURLRejected},
		{"bad type", "PUT", "subscriptions/s", map[string]any{"type": "email", "pattern": "e/*"}, 400, codeInvalidRequest},
		{"no pattern or streams", "PUT", "subscriptions/s", map[string]any{"type": "webhook", "webhook": map[string]any{"url": "http://127.0.0.1/x"}}, 400, codeInvalidRequest},
		{"missing webhook", "PUT", "subscriptions/s", map[string]any{"type": "webhook", "pattern": "e/*"}, 400, codeInvalidRequest},
		{"lease too short", "PUT", "subscriptions/s", map[string]any{"type": "webhook", "pattern": "e/*", "webhook": map[string]any{"url": "http://127.0.0.1/x"}, "lease_ttl_ms": 999}, 400, codeInvalidRequest},
		{"lease fractional", "PUT", "subscriptions/s", map[string]any{"type": "webhook", "pattern": "e/*", "webhook": map[string]any{"url": "http://127.0.0.1/x"}, "lease_ttl_ms": 1500.5}, 400, codeInvalidRequest},
		{"lease too long", "PUT", "subscriptions/s", map[string]any{"type": "webhook", "pattern": "e/*", "webhook": map[string]any{"url": "http://127.0.0.1/x"}, "lease_ttl_ms": 600001}, 400, codeInvalidRequest},
		{"streams not strings", "PUT", "subscriptions/s", map[string]any{"type": "webhook", "streams": []any{1}, "webhook": map[string]any{"url": "http://127.0.0.1/x"}}, 400, codeInvalidRequest},
		{"invalid json", "PUT", "subscriptions/s", "{", 400, codeInvalidRequest},
		{"missing wake stream field", "PUT", "subscriptions/s", map[string]any{"type": "pull-wake", "pattern": "e/*"}, 400, codeInvalidRequest},
		{"wake stream missing", "PUT", "subscriptions/s", map[string]any{"type": "pull-wake", "pattern": "e/*", "wake_stream": "nope"}, 400, codeInvalidRequest},
		{"wake stream not json", "PUT", "subscriptions/s", map[string]any{"type": "pull-wake", "pattern": "e/*", "wake_stream": "wake/bin"}, 400, codeInvalidRequest},
		{"unknown route", "GET", "nothing", nil, 404, codeRouteNotFound},
		{"unknown action", "POST", "subscriptions/s/frobnicate", nil, 404, codeRouteNotFound},
		{"bad method", "PATCH", "subscriptions/s", nil, 405, codeMethodNotAllowed},
		{"jwks bad method", "POST", "jwks.json", nil, 405, codeMethodNotAllowed},
		{"get missing", "GET", "subscriptions/missing", nil, 404, codeNotFound},
		{"streams on missing", "POST", "subscriptions/missing/streams", map[string]any{"streams": []string{"a"}}, 404, codeNotFound},
		{"claim on missing", "POST", "subscriptions/missing/claim", map[string]any{"worker": "w"}, 404, codeNotFound},
		{"claim without worker", "POST", "subscriptions/missing/claim", map[string]any{}, 400, codeInvalidRequest},
		{"ack without token", "POST", "subscriptions/missing/ack", map[string]any{}, 401, codeTokenInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, body := h.do(tt.method, tt.path, tt.body)
			if status != tt.status || errCode(body) != tt.code {
				t.Fatalf("%s %s = %d %v, want %d %s", tt.method, tt.path, status, body, tt.status, tt.code)
			}
		})
	}
}

func TestWebhookSynchronousDone(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	rcv := newReceiver(t, func(int) (int, string) { return 200, `{"done":true}` })
	status, created := h.do("PUT", "subscriptions/sync", map[string]any{
		"type": "webhook", "pattern": "events/*", "webhook": map[string]any{"url": rcv.url()}, "lease_ttl_ms": 1000,
	})
	if status != http.StatusCreated {
		t.Fatalf("create = %d %v", status, created)
	}
	resp, err := http.Get(created["webhook"].(map[string]any)["signing"].(map[string]any)["jwks_url"].(string))
	if err != nil {
		t.Fatal(err)
	}
	var jwks map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&jwks)
	resp.Body.Close()

	h.write("events/one", `{"event":"created"}`)
	n := rcv.wait(t, 1)
	if err := verifySignature(n.raw, n.sig, jwks); err != nil {
		t.Fatalf("signature: %v", err)
	}
	if n.body["subscription_id"] != "sync" {
		t.Errorf("subscription_id = %v", n.body["subscription_id"])
	}
	if want := h.srv.URL + root + "__ds/subscriptions/sync/callback"; n.body["callback_url"] != want {
		t.Errorf("callback_url = %v, want %s", n.body["callback_url"], want)
	}
	st := streamByPath(t, n.body, "events/one")
	if st["has_pending"] != true || st["tail_offset"] != h.tail("events/one") || st["link_type"] != "glob" {
		t.Errorf("stream = %v", st)
	}
	await.True(t, "auto-ack", func() bool {
		_, body := h.do("GET", "subscriptions/sync", nil)
		return streamByPath(t, body, "events/one")["acked_offset"] == st["tail_offset"]
	})

	// A write to a stream outside the pattern wakes nobody; one inside does.
	h.write("other/x", `{}`)
	h.write("events/one", `{"event":"second"}`)
	n2 := rcv.wait(t, 2)
	if n2.body["generation"].(float64) <= n.body["generation"].(float64) {
		t.Errorf("generation did not increase: %v then %v", n.body["generation"], n2.body["generation"])
	}
	if _, body := h.do("GET", "subscriptions/sync", nil); len(body["streams"].([]any)) != 1 {
		t.Errorf("streams = %v", body["streams"])
	}
}

func TestWebhookCallbackFencing(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	rcv := newReceiver(t, nil)
	// The longest lease, so that it cannot expire while the cases run on a
	// busy machine: this test is about fencing, not expiry.
	h.do("PUT", "subscriptions/cb", map[string]any{
		"type": "webhook", "pattern": "events/*", "webhook": map[string]any{"url": rcv.url()}, "lease_ttl_ms": maxLeaseTTLMS,
	})
	h.write("events/cb", `{"event":"created"}`)
	n := rcv.wait(t, 1).body
	cbURL, err := url.Parse(n["callback_url"].(string))
	if err != nil {
		t.Fatal(err)
	}
	cbPath := strings.TrimPrefix(cbURL.Path, root+"__ds/")
	token := n["callback_token"].(string)
	tail := streamByPath(t, n, "events/cb")["tail_offset"].(string)
	ack := map[string]any{
		"wake_id": n["wake_id"], "generation": n["generation"],
		"acks": []any{map[string]any{"stream": "events/cb", "offset": tail}}, "done": true,
	}

	tests := []struct {
		name   string
		body   any
		token  string
		status int
		code   errcode.Code
	}{
		{"no token", ack, "", 401, codeTokenInvalid},
		{"forged token", ack, "abc.def", 401, codeTokenInvalid},
		{"wrong wake", map[string]any{"wake_id": "w_x", "generation": n["generation"]}, token, 409, codeFenced},
		{"wrong generation", map[string]any{"wake_id": n["wake_id"], "generation": 99}, token, 409, codeFenced},
		{"unknown stream", map[string]any{"wake_id": n["wake_id"], "generation": n["generation"], "acks": []any{map[string]any{"stream": "nope", "offset": tail}}}, token, 409, codeInvalidOffset},
		{"beyond tail", map[string]any{"wake_id": n["wake_id"], "generation": n["generation"], "acks": []any{map[string]any{"stream": "events/cb", "offset": "9999999999999999_9999999999999999"}}}, token, 409, codeInvalidOffset},
		{"minus one", map[string]any{"wake_id": n["wake_id"], "generation": n["generation"], "acks": []any{map[string]any{"stream": "events/cb", "offset": "-1"}}}, token, 409, codeInvalidOffset},
		{"heartbeat", map[string]any{"wake_id": n["wake_id"], "generation": n["generation"]}, token, 200, 0},
		{"done", ack, token, 200, 0},
		{"stale", ack, token, 409, codeFenced},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var hdr []string
			if tt.token != "" {
				hdr = []string{"Authorization", "Bearer " + tt.token}
			}
			status, body := h.do("POST", cbPath, tt.body, hdr...)
			if status != tt.status || errCode(body) != tt.code {
				t.Fatalf("callback = %d %v, want %d %s", status, body, tt.status, tt.code)
			}
			if tt.name == "done" && (body["ok"] != true || body["next_wake"] != false) {
				t.Errorf("done body = %v", body)
			}
		})
	}
	_, body := h.do("GET", "subscriptions/cb", nil)
	if got := streamByPath(t, body, "events/cb")["acked_offset"]; got != tail {
		t.Errorf("acked = %v, want %s", got, tail)
	}
}

func TestWebhookLeaseExpiryRedelivers(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	rcv := newReceiver(t, nil)
	h.do("PUT", "subscriptions/lease", map[string]any{
		"type": "webhook", "streams": []string{"jobs/a"}, "webhook": map[string]any{"url": rcv.url()}, "lease_ttl_ms": 1000,
	})
	h.write("jobs/a", `{"n":1}`)
	first := rcv.wait(t, 1).body
	second := rcv.wait(t, 2).body // the worker never called back
	if second["generation"].(float64) != first["generation"].(float64)+1 || second["wake_id"] == first["wake_id"] {
		t.Errorf("redelivery %v after %v", second, first)
	}
	cb := strings.TrimPrefix(mustURL(t, first["callback_url"].(string)).Path, root+"__ds/")
	status, body := h.do("POST", cb, map[string]any{"wake_id": first["wake_id"], "generation": first["generation"], "done": true},
		"Authorization", "Bearer "+first["callback_token"].(string))
	if status != http.StatusConflict || errCode(body) != codeFenced {
		t.Errorf("stale callback = %d %v", status, body)
	}
}

func mustURL(t testing.TB, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

func TestWebhookRetries(t *testing.T) {
	cfg := Config{RetryInitialBackoff: 10 * time.Millisecond, RetryMaxBackoff: 40 * time.Millisecond}
	h := newHarness(t, cfg, nil)
	rcv := newReceiver(t, func(n int) (int, string) {
		if n <= 2 {
			return http.StatusServiceUnavailable, `{}`
		}
		return http.StatusOK, `{"done":true}`
	})
	h.do("PUT", "subscriptions/retry", map[string]any{
		"type": "webhook", "pattern": "r/**", "webhook": map[string]any{"url": rcv.url()},
	})
	h.write("r/a/b", `{"x":1}`)
	got := rcv.wait(t, 3)
	first := rcv.wait(t, 1)
	if got.body["wake_id"] != first.body["wake_id"] {
		t.Errorf("retry changed the wake: %v vs %v", got.body["wake_id"], first.body["wake_id"])
	}
	await.True(t, "ack after retries", func() bool {
		_, body := h.do("GET", "subscriptions/retry", nil)
		return body["status"] == "active" && streamByPath(t, body, "r/a/b")["acked_offset"] == h.tail("r/a/b")
	})
}

func TestWebhookAttemptsAreBounded(t *testing.T) {
	cfg := Config{RetryInitialBackoff: 5 * time.Millisecond, RetryMaxBackoff: 5 * time.Millisecond, MaxDeliveryAttempts: 3}
	h := newHarness(t, cfg, nil)
	rcv := newReceiver(t, func(int) (int, string) { return http.StatusInternalServerError, `{}` })
	h.do("PUT", "subscriptions/bounded", map[string]any{
		"type": "webhook", "pattern": "b/*", "webhook": map[string]any{"url": rcv.url()},
	})
	h.write("b/x", `{}`)
	rcv.wait(t, 3)
	// The third failure drops the wake; nothing is delivered after that, so
	// the count is final once the wake is gone.
	s := h.m.getSub("bounded")
	await.True(t, "the wake dropped after the last attempt", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.wakeID == "" && !s.delivering
	})
	if n := rcv.count(); n != 3 {
		t.Errorf("%d deliveries, want 3", n)
	}
	if _, body := h.do("GET", "subscriptions/bounded", nil); body["status"] != "failed" {
		t.Errorf("status = %v, want failed", body["status"])
	}
}

func TestExplicitLinks(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	rcv := newReceiver(t, nil)
	h.write("manual/c", `{"pre":true}`)
	// Observer events are applied in the background: the stream must be
	// known before the subscription is created for it to count as existing.
	await.True(t, "the write to manual/c to be observed", func() bool { return slices.Contains(h.m.knownStreams(), "manual/c") })
	status, body := h.do("PUT", "subscriptions/explicit", map[string]any{
		"type": "webhook", "pattern": "manual/c", "streams": []string{"manual/a", "manual/c"}, "webhook": map[string]any{"url": rcv.url()},
	})
	if status != http.StatusCreated {
		t.Fatalf("create = %d %v", status, body)
	}
	if got := streamByPath(t, body, "manual/c")["acked_offset"]; got != h.tail("manual/c") {
		t.Errorf("existing stream linked at %v, want its tail", got)
	}
	steps := []struct {
		name   string
		method string
		path   string
		body   any
		status int
	}{
		{"add", "POST", "subscriptions/explicit/streams", map[string]any{"streams": []string{"manual/b"}}, 204},
		{"add again", "POST", "subscriptions/explicit/streams", map[string]any{"streams": []string{"manual/b"}}, 204},
		{"add empty", "POST", "subscriptions/explicit/streams", map[string]any{"streams": []string{}}, 400},
		{"remove", "DELETE", "subscriptions/explicit/streams/" + url.PathEscape("manual/b"), nil, 204},
		{"remove again", "DELETE", "subscriptions/explicit/streams/manual%2Fb", nil, 204},
		{"remove explicit keeps glob", "DELETE", "subscriptions/explicit/streams/manual/c", nil, 204},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if status, body := h.do(s.method, s.path, s.body); status != s.status {
				t.Fatalf("%s %s = %d %v, want %d", s.method, s.path, status, body, s.status)
			}
		})
	}
	_, body = h.do("GET", "subscriptions/explicit", nil)
	want := map[string]string{"manual/a": "explicit", "manual/c": "glob"}
	streams := body["streams"].([]any)
	if len(streams) != len(want) {
		t.Fatalf("streams = %v", streams)
	}
	for _, s := range streams {
		st := s.(map[string]any)
		if want[st["path"].(string)] != st["link_type"] {
			t.Errorf("link %v, want type %s", st, want[st["path"].(string)])
		}
	}
	if a := streamByPath(t, body, "manual/a"); a["acked_offset"] != zeroOffset {
		t.Errorf("missing stream linked at %v", a["acked_offset"])
	}
}

func TestPullWake(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	h.fake.write("__ds", "wake/pool", "application/json", []byte(`[]`))
	// The longest lease, so that worker-1's claim cannot expire before its
	// ack on a busy machine: expiry is TestPullWakeLeaseExpiry's subject.
	status, body := h.do("PUT", "subscriptions/pull", map[string]any{
		"type": "pull-wake", "pattern": "events/*", "wake_stream": "wake/pool", "lease_ttl_ms": maxLeaseTTLMS,
	})
	if status != http.StatusCreated || body["wake_stream"] != "wake/pool" || body["webhook"] != nil {
		t.Fatalf("create = %d %v", status, body)
	}
	if status, body := h.do("POST", "subscriptions/pull/claim", map[string]any{"worker": "w0"}); status != 409 || errCode(body) != codeNoPendingWork {
		t.Errorf("claim with nothing pending = %d %v", status, body)
	}
	h.write("events/pull", `{"event":"created"}`)
	await.True(t, "wake event", func() bool {
		for _, ev := range h.fake.lines("__ds", "wake/pool") {
			if ev["subscription_id"] == "pull" && ev["type"] == "wake" && ev["stream"] == "events/pull" {
				return true
			}
		}
		return false
	})

	status, claimed := h.do("POST", "subscriptions/pull/claim", map[string]any{"worker": "worker-1"})
	if status != http.StatusOK || claimed["lease_ttl_ms"] != float64(maxLeaseTTLMS) {
		t.Fatalf("claim = %d %v", status, claimed)
	}
	tail := streamByPath(t, claimed, "events/pull")["tail_offset"].(string)
	status, busy := h.do("POST", "subscriptions/pull/claim", map[string]any{"worker": "worker-2"})
	if status != http.StatusConflict || errCode(busy) != codeAlreadyClaimed || busy["error"].(map[string]any)["current_holder"] != "worker-1" {
		t.Errorf("second claim = %d %v", status, busy)
	}
	auth := []string{"Authorization", "Bearer " + claimed["token"].(string)}
	if status, body := h.do("POST", "subscriptions/pull/callback", map[string]any{}, auth...); status != 400 {
		t.Errorf("webhook callback on pull-wake = %d %v", status, body)
	}
	status, acked := h.do("POST", "subscriptions/pull/ack", map[string]any{
		"wake_id": claimed["wake_id"], "generation": claimed["generation"],
		"acks": []any{map[string]any{"stream": "events/pull", "offset": tail}}, "done": true,
	}, auth...)
	if status != http.StatusOK || acked["ok"] != true || acked["next_wake"] != false {
		t.Fatalf("ack = %d %v", status, acked)
	}

	// The next write may or may not have reached the hook: claim must work either way.
	h.fake.write("__ds", "events/pull", "application/json", []byte(`{"event":"second"}`))
	status, claimed2 := h.do("POST", "subscriptions/pull/claim", map[string]any{"worker": "worker-1"})
	if status != http.StatusOK || claimed2["generation"].(float64) <= claimed["generation"].(float64) {
		t.Fatalf("claim2 = %d %v", status, claimed2)
	}
	h.m.StreamWritten(t.Context(), "events/pull")
	auth2 := []string{"Authorization", "Bearer " + claimed2["token"].(string)}
	release := map[string]any{"wake_id": claimed2["wake_id"], "generation": claimed2["generation"]}
	if status, body := h.do("POST", "subscriptions/pull/release", release, auth2...); status != http.StatusNoContent {
		t.Fatalf("release = %d %v", status, body)
	}
	if status, body := h.do("POST", "subscriptions/pull/release", release, auth2...); status != 409 || errCode(body) != codeFenced {
		t.Errorf("second release = %d %v", status, body)
	}
	// Released with work pending: a new wake is announced and can be claimed.
	status, claimed3 := h.do("POST", "subscriptions/pull/claim", map[string]any{"worker": "worker-3"})
	if status != http.StatusOK || claimed3["generation"].(float64) <= claimed2["generation"].(float64) {
		t.Errorf("claim3 = %d %v", status, claimed3)
	}
}

func TestPullWakeLeaseExpiry(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	h.fake.write("__ds", "wake/q", "application/json", []byte(`[]`))
	h.do("PUT", "subscriptions/exp", map[string]any{
		"type": "pull-wake", "streams": []string{"q/a"}, "wake_stream": "wake/q", "lease_ttl_ms": 1000,
	})
	h.write("q/a", `{}`)
	_, c1 := h.do("POST", "subscriptions/exp/claim", map[string]any{"worker": "slow"})
	if c1["token"] == nil {
		t.Fatalf("claim = %v", c1)
	}
	var c2 map[string]any
	await.True(t, "lease expiry", func() bool {
		var status int
		status, c2 = h.do("POST", "subscriptions/exp/claim", map[string]any{"worker": "fast"})
		return status == http.StatusOK
	})
	if c2["generation"].(float64) <= c1["generation"].(float64) {
		t.Errorf("generation %v after %v", c2["generation"], c1["generation"])
	}
	status, body := h.do("POST", "subscriptions/exp/ack", map[string]any{"wake_id": c1["wake_id"], "generation": c1["generation"], "done": true},
		"Authorization", "Bearer "+c1["token"].(string))
	if status != http.StatusConflict || errCode(body) != codeFenced {
		t.Errorf("stale ack = %d %v", status, body)
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	fake := newFakeStreams()
	rcv := newReceiver(t, func(int) (int, string) { return 200, `{"done":true}` })
	h1 := newHarness(t, Config{}, fake)
	h1.do("PUT", "subscriptions/durable", map[string]any{
		"type": "webhook", "pattern": "d/*", "streams": []string{"x/1"}, "webhook": map[string]any{"url": rcv.url()}, "description": "",
	})
	h1.do("POST", "subscriptions/durable/streams", map[string]any{"streams": []string{"x/2"}})
	h1.do("PUT", "subscriptions/gone", map[string]any{"type": "webhook", "pattern": "g/*", "webhook": map[string]any{"url": rcv.url()}})
	h1.do("DELETE", "subscriptions/gone", nil)
	h1.write("d/a", `{"v":1}`)
	rcv.wait(t, 1)
	tail := h1.tail("d/a")
	await.True(t, "auto-ack", func() bool {
		_, body := h1.do("GET", "subscriptions/durable", nil)
		return streamByPath(t, body, "d/a")["acked_offset"] == tail
	})
	_, before := h1.do("GET", "subscriptions/durable", nil)
	h1.stop()

	h2 := newHarness(t, Config{}, fake)
	status, after := h2.do("GET", "subscriptions/durable", nil)
	if status != http.StatusOK {
		t.Fatalf("get after restart = %d %v", status, after)
	}
	for _, k := range []string{"id", "type", "pattern", "streams", "created_at", "description", "lease_ttl_ms"} {
		if a, b := fmt.Sprint(before[k]), fmt.Sprint(after[k]); a != b {
			t.Errorf("%s: %s before restart, %s after", k, a, b)
		}
	}
	if status, _ := h2.do("GET", "subscriptions/gone", nil); status != http.StatusNotFound {
		t.Errorf("deleted subscription came back: %d", status)
	}
	// Identical re-PUT after restart confirms.
	status, _ = h2.do("PUT", "subscriptions/durable", map[string]any{
		"type": "webhook", "pattern": "d/*", "streams": []string{"x/1"}, "webhook": map[string]any{"url": rcv.url()}, "description": "",
	})
	if status != http.StatusOK {
		t.Errorf("re-put after restart = %d", status)
	}
	// Work left pending across the restart is delivered without a new write.
	fake.write("__ds", "d/a", "application/json", []byte(`{"v":2}`))
	h2.stop()
	h3 := newHarness(t, Config{}, fake)
	rcv.wait(t, 2)
	await.True(t, "ack after restart", func() bool {
		_, body := h3.do("GET", "subscriptions/durable", nil)
		return streamByPath(t, body, "d/a")["acked_offset"] == h3.tail("d/a")
	})
}

func TestStreamDeletedDropsGlobLink(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	rcv := newReceiver(t, func(int) (int, string) { return 200, `{"done":true}` })
	h.do("PUT", "subscriptions/del", map[string]any{
		"type": "webhook", "pattern": "z/*", "streams": []string{"z/keep"}, "webhook": map[string]any{"url": rcv.url()},
	})
	h.write("z/drop", `{}`)
	h.write("z/keep", `{}`)
	await.True(t, "acks", func() bool {
		_, body := h.do("GET", "subscriptions/del", nil)
		return len(body["streams"].([]any)) == 2 &&
			streamByPath(t, body, "z/drop")["acked_offset"] == h.tail("z/drop") &&
			streamByPath(t, body, "z/keep")["acked_offset"] == h.tail("z/keep")
	})
	for _, p := range []string{"z/drop", "z/keep"} {
		if _, err := h.fake.DeleteStream(t.Context(), &streamv1.DeleteStreamRequest{Ref: &streamv1.StreamRef{Bucket: "__ds", Stream: p}}); err != nil {
			t.Fatal(err)
		}
		h.m.StreamDeleted(t.Context(), p)
	}
	await.True(t, "unlink", func() bool {
		_, body := h.do("GET", "subscriptions/del", nil)
		streams := body["streams"].([]any)
		return len(streams) == 1 && streams[0].(map[string]any)["acked_offset"] == zeroOffset
	})
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{}, true},
		{"bad root", Config{StreamRoot: "v1/"}, false},
		{"bad public url", Config{PublicURL: "ftp://x"}, false},
		{"jitter", Config{RetryJitter: 1.5}, false},
		{"backoff order", Config{RetryInitialBackoff: time.Minute, RetryMaxBackoff: time.Second}, false},
		{"workers", Config{DeliveryWorkers: -1}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); (err == nil) != tt.ok {
				t.Errorf("Validate() = %v, want ok=%v", err, tt.ok)
			}
		})
	}
}

func TestForwardedOrigin(t *testing.T) {
	h := newHarness(t, Config{}, nil)
	status, body := h.do("PUT", "subscriptions/fwd", map[string]any{
		"type": "webhook", "pattern": "f/*", "webhook": map[string]any{"url": "http://localhost:1/x"},
	}, "X-Forwarded-Proto", "https", "X-Forwarded-Host", "streams.example.com")
	if status != http.StatusCreated {
		t.Fatalf("create = %d %v", status, body)
	}
	got := body["webhook"].(map[string]any)["signing"].(map[string]any)["jwks_url"]
	if want := "https://streams.example.com" + root + "__ds/jwks.json"; got != want {
		t.Errorf("jwks_url = %v, want %s", got, want)
	}
}
