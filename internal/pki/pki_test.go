package pki

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseIdentity(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Identity
		bad  bool
	}{
		{in: "urn:ursula:node:7", want: NodeIdentity(7)},
		{in: "urn:ursula:role:gateway", want: RoleIdentity(RoleGateway)},
		{in: "urn:ursula:node:0", bad: true},
		{in: "urn:ursula:node:-1", bad: true},
		{in: "urn:ursula:node:7x", bad: true},
		{in: "urn:ursula:role:", bad: true},
		{in: "urn:ursula:role:Gateway", bad: true},
		{in: "urn:ursula:other:1", bad: true},
		{in: "spiffe://x/node/1", bad: true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseIdentity(tc.in)
			if tc.bad {
				if err == nil {
					t.Fatalf("ParseIdentity(%q) = %v, want an error", tc.in, got)
				}
				return
			}
			if err != nil || got != tc.want || got.String() != tc.in {
				t.Fatalf("ParseIdentity(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

// testPKI is a CA and a directory to issue into.
type testPKI struct {
	ca     *CA
	dir    string
	caFile string
}

func newTestPKI(t testing.TB) *testPKI {
	t.Helper()
	ca, err := NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := ca.Save(dir); err != nil {
		t.Fatal(err)
	}
	return &testPKI{ca: ca, dir: dir, caFile: filepath.Join(dir, "ca.crt")}
}

func (p *testPKI) issue(t testing.TB, name string, id Identity) Files {
	t.Helper()
	is, err := p.ca.Issue(id, []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f, err := is.Save(p.dir, name, p.caFile)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func load(t testing.TB, f Files) *Source {
	t.Helper()
	s, err := Load(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	s.CheckInterval = 0
	return s
}

// handshake runs one TLS handshake between a server with srv and a client
// with cli and returns the client's error and the identity the server saw.
func handshake(t *testing.T, srv, cli *tls.Config) (Identity, error, error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	type res struct {
		id  Identity
		err error
	}
	done := make(chan res, 1)
	go func() {
		sc := tls.Server(a, srv)
		err := sc.Handshake()
		var id Identity
		if err == nil {
			id, err = PeerIdentity(sc.ConnectionState())
		}
		_ = a.Close()
		done <- res{id, err}
	}()
	cc := tls.Client(b, cli)
	cerr := cc.Handshake()
	if cerr == nil {
		// TLS 1.3: the server's verdict on our certificate arrives with the
		// first read.
		_, cerr = cc.Read(make([]byte, 1))
		if errors.Is(cerr, io.EOF) {
			cerr = nil
		}
	}
	_ = b.Close()
	r := <-done
	return r.id, cerr, r.err
}

func TestMutualTLS(t *testing.T) {
	p := newTestPKI(t)
	node1 := load(t, p.issue(t, "node1", NodeIdentity(1)))
	node2 := load(t, p.issue(t, "node2", NodeIdentity(2)))
	other := newTestPKI(t)
	foreign := load(t, other.issue(t, "node2", NodeIdentity(2)))
	caOnly := load(t, Files{CAFile: p.caFile})

	t.Run("peer proves its node id", func(t *testing.T) {
		id, cerr, serr := handshake(t, node1.ServerConfig(tls.RequireAndVerifyClientCert), node2.ClientConfig(ExpectNode(1)))
		if cerr != nil || serr != nil || id != NodeIdentity(2) {
			t.Fatalf("got %v, client %v, server %v", id, cerr, serr)
		}
	})
	t.Run("server of another node id", func(t *testing.T) {
		_, cerr, _ := handshake(t, node1.ServerConfig(tls.RequireAndVerifyClientCert), node2.ClientConfig(ExpectNode(3)))
		if cerr == nil || !strings.Contains(cerr.Error(), "urn:ursula:node:1") {
			t.Fatalf("client error %v, want a refusal naming node 1", cerr)
		}
	})
	t.Run("client of another CA", func(t *testing.T) {
		_, _, serr := handshake(t, node1.ServerConfig(tls.RequireAndVerifyClientCert), foreign.ClientConfig(nil))
		if serr == nil {
			t.Fatal("a certificate of another CA was accepted")
		}
	})
	t.Run("server of another CA", func(t *testing.T) {
		_, cerr, _ := handshake(t, foreign.ServerConfig(tls.RequireAndVerifyClientCert), node1.ClientConfig(nil))
		if cerr == nil {
			t.Fatal("a server of another CA was accepted")
		}
	})
	t.Run("client without a certificate", func(t *testing.T) {
		_, _, serr := handshake(t, node1.ServerConfig(tls.RequireAndVerifyClientCert), caOnly.ClientConfig(ExpectAnyNode))
		if serr == nil {
			t.Fatal("a client without a certificate was accepted")
		}
		id, cerr, serr := handshake(t, node1.ServerConfig(tls.VerifyClientCertIfGiven), caOnly.ClientConfig(ExpectAnyNode))
		if cerr != nil || serr == nil || id != (Identity{}) {
			t.Fatalf("optional client certificate: id %v, client %v, server %v", id, cerr, serr)
		}
	})
}

func TestALPN(t *testing.T) {
	for _, tc := range []struct {
		offered []string
		want    string
	}{
		{offered: []string{"h2"}, want: "h2"},
		{offered: []string{"h2", "http/1.1"}, want: "http/1.1"},
		{offered: []string{"http/1.1"}, want: "http/1.1"},
	} {
		if got := alpnFor(tc.offered); len(got) != 1 || got[0] != tc.want {
			t.Errorf("alpnFor(%v) = %v, want %s", tc.offered, got, tc.want)
		}
	}
}

func TestReload(t *testing.T) {
	p := newTestPKI(t)
	f := p.issue(t, "node1", NodeIdentity(1))
	s := load(t, f)
	first := s.NotAfter()

	// A rotated certificate of the same identity is picked up.
	is, err := p.ca.Issue(NodeIdentity(1), nil, 2*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := is.Save(p.dir, "node1", p.caFile); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err != nil {
		t.Fatal(err)
	}
	if !s.NotAfter().After(first) || s.Reloads() != 1 {
		t.Fatalf("not reloaded: not_after %v (was %v), reloads %d", s.NotAfter(), first, s.Reloads())
	}

	// A broken set keeps the previous one.
	rotated := s.NotAfter()
	if err := os.WriteFile(f.CertFile, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(); err == nil {
		t.Fatal("a broken certificate file loaded")
	}
	if !s.NotAfter().Equal(rotated) || s.Identity() != NodeIdentity(1) {
		t.Fatal("a broken reload replaced the material")
	}

	// A certificate of another identity is refused too.
	p.issue(t, "node1", NodeIdentity(2))
	if err := s.Reload(); err == nil || s.Identity() != NodeIdentity(1) {
		t.Fatalf("reload to another identity: %v, identity %v", err, s.Identity())
	}
}

func TestLoadRefuses(t *testing.T) {
	p := newTestPKI(t)
	f := p.issue(t, "node1", NodeIdentity(1))
	t.Run("readable key", func(t *testing.T) {
		if err := os.Chmod(f.KeyFile, 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(f.KeyFile, 0o600)
		if _, err := Load(f, nil); err == nil || !strings.Contains(err.Error(), "chmod 600") {
			t.Fatalf("Load = %v, want a key mode refusal", err)
		}
	})
	t.Run("certificate of another CA", func(t *testing.T) {
		other := newTestPKI(t)
		g := f
		g.CAFile = other.caFile
		if _, err := Load(g, nil); err == nil || !strings.Contains(err.Error(), "does not chain") {
			t.Fatalf("Load = %v, want a chain refusal", err)
		}
	})
	t.Run("no identity", func(t *testing.T) {
		if _, err := p.ca.Issue(Identity{}, nil, time.Hour); err == nil {
			t.Fatal("issued a certificate without an identity")
		}
	})
}
