package pki

import (
	"context"
	"crypto/tls"
	"errors"
	"net"

	"google.golang.org/grpc/credentials"
)

// Terminated is the gRPC server credentials of a listener whose connections
// are TLS already (a plane that serves gRPC and HTTP on one TLS port
// splits connections after decrypting them; tls.NewListener); it completes
// a handshake not yet run. It reports the connection's TLS state as the peer's
// AuthInfo, so handlers and tap handles see the verified client
// certificate as with credentials.NewTLS. A connection that is not TLS is
// refused.
func Terminated() credentials.TransportCredentials { return terminated{} }

type terminated struct{}

func (terminated) ClientHandshake(context.Context, string, net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return nil, nil, errors.New("pki: terminated TLS credentials are for servers")
}

func (terminated) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tc := TLSConn(c)
	if tc == nil {
		return nil, nil, errors.New("pki: the connection is not TLS")
	}
	// A listener that defers the handshake (tls.NewListener) leaves it to
	// the first use; gRPC bounds this call with its connection timeout.
	if err := tc.Handshake(); err != nil {
		return nil, nil, err
	}
	return c, credentials.TLSInfo{
		State:          tc.ConnectionState(),
		CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity},
	}, nil
}

func (terminated) Info() credentials.ProtocolInfo {
	return credentials.ProtocolInfo{SecurityProtocol: "tls"}
}

func (t terminated) Clone() credentials.TransportCredentials { return t }

func (terminated) OverrideServerName(string) error { return nil }

// TLSConn unwraps c (through NetConn methods) to its *tls.Conn, or nil.
func TLSConn(c net.Conn) *tls.Conn {
	for c != nil {
		if tc, ok := c.(*tls.Conn); ok {
			return tc
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = u.NetConn()
	}
	return nil
}

// FromAuthInfo is the identity a gRPC peer's AuthInfo proves (TLS with a
// verified client certificate), or false.
func FromAuthInfo(ai credentials.AuthInfo) (Identity, bool) {
	ti, ok := ai.(credentials.TLSInfo)
	if !ok {
		return Identity{}, false
	}
	id, err := PeerIdentity(ti.State)
	return id, err == nil
}
