package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
)

// alpnFor picks the application protocol of a connection to a plane that
// serves gRPC and HTTP/1 on one port: HTTP/1.1 to any client that offers
// it (curl, browsers, Prometheus), so that their requests reach the HTTP
// handler, and h2 to clients that offer only h2 (gRPC).
func alpnFor(offered []string) []string {
	if slices.Contains(offered, "http/1.1") {
		return []string{"http/1.1"}
	}
	return []string{"h2"}
}

// ServerConfig is the TLS configuration of a listener: this process's
// current certificate, and client certificates checked against the current
// CA as clientAuth says (tls.RequireAndVerifyClientCert on the cluster
// plane, tls.VerifyClientCertIfGiven where bearer tokens are accepted too).
// The source must hold a certificate.
func (s *Source) ServerConfig(clientAuth tls.ClientAuthType) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.material()
			if m.cert == nil {
				return nil, errors.New("pki: this process has no certificate to serve")
			}
			return &tls.Config{
				MinVersion:   tls.VersionTLS12,
				Certificates: []tls.Certificate{*m.cert},
				ClientCAs:    m.roots,
				ClientAuth:   clientAuth,
				NextProtos:   alpnFor(hello.SupportedProtos),
			}, nil
		},
	}
}

// ClientConfig is the TLS configuration of a connection to a server whose
// certificate must chain to the current CA and prove an identity want
// accepts (nil accepts any). It presents this process's certificate, if
// it has one. Server names and addresses are not checked: the identity is
// (see the package comment).
func (s *Source) ClientConfig(want func(Identity) error) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// The chain is verified by VerifyConnection, against the CA current
		// at the handshake, and the server by its identity, not its name.
		InsecureSkipVerify: true,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			if m := s.material(); m.cert != nil {
				return m.cert, nil
			}
			return &tls.Certificate{}, nil
		},
		VerifyConnection: func(cs tls.ConnectionState) error {
			id, err := s.verify(cs.PeerCertificates, x509.ExtKeyUsageServerAuth)
			if err != nil {
				return err
			}
			if want != nil {
				return want(id)
			}
			return nil
		},
	}
}

// verify checks a presented chain against the current CA and returns the
// identity of its leaf.
func (s *Source) verify(chain []*x509.Certificate, usage x509.ExtKeyUsage) (Identity, error) {
	if len(chain) == 0 {
		return Identity{}, errors.New("pki: the peer presented no certificate")
	}
	m := s.material()
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: m.roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return Identity{}, fmt.Errorf("pki: the peer's certificate: %w", err)
	}
	return IdentityOf(chain[0])
}

// ExpectNode accepts only storage node id.
func ExpectNode(id uint64) func(Identity) error {
	return func(got Identity) error {
		if got != NodeIdentity(id) {
			return fmt.Errorf("pki: expected %s, the peer's certificate proves %s", NodeIdentity(id), got)
		}
		return nil
	}
}

// ExpectAnyNode accepts any storage node.
func ExpectAnyNode(got Identity) error {
	if !got.IsNode() {
		return fmt.Errorf("pki: expected a storage node, the peer's certificate proves %s", got)
	}
	return nil
}
