package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// Roles a non-node process proves with its certificate (urn:ursula:role:…).
const (
	// RoleGateway is the HTTP gateway (and its subscription role): every
	// stream service call, reserved buckets included.
	RoleGateway = "gateway"
	// RoleColdGC is the cold-GC worker: the cold-GC service only.
	RoleColdGC = "coldgc"
	// RoleBackup is the backup service.
	RoleBackup = "backup"
	// RoleOperator is a person or tool on the admin plane (like its token).
	RoleOperator = "operator"
)

const (
	uriPrefix  = "urn:ursula:"
	nodePrefix = uriPrefix + "node:"
	rolePrefix = uriPrefix + "role:"
)

// ErrNoIdentity reports a certificate that proves no Ursula identity (or
// more than one).
var ErrNoIdentity = errors.New("pki: the certificate names no single urn:ursula: identity")

// Identity is who a certificate proves: a storage node (Node non-zero) or
// a role (Role non-empty), never both.
type Identity struct {
	Node uint64
	Role string
}

// NodeIdentity is storage node id.
func NodeIdentity(id uint64) Identity { return Identity{Node: id} }

// RoleIdentity is a process of role.
func RoleIdentity(role string) Identity { return Identity{Role: role} }

// IsNode reports a storage node.
func (i Identity) IsNode() bool { return i.Node != 0 }

// URI is the identity's subject alternative name.
func (i Identity) URI() *url.URL {
	u, _ := url.Parse(i.String())
	return u
}

// String is the URI form, urn:ursula:node:7 or urn:ursula:role:gateway.
func (i Identity) String() string {
	if i.IsNode() {
		return nodePrefix + strconv.FormatUint(i.Node, 10)
	}
	return rolePrefix + i.Role
}

// ParseIdentity parses the URI form.
func ParseIdentity(s string) (Identity, error) {
	switch {
	case strings.HasPrefix(s, nodePrefix):
		id, err := strconv.ParseUint(strings.TrimPrefix(s, nodePrefix), 10, 64)
		if err != nil || id == 0 {
			return Identity{}, fmt.Errorf("pki: %q: the node id must be a non-zero decimal", s)
		}
		return NodeIdentity(id), nil
	case strings.HasPrefix(s, rolePrefix):
		role := strings.TrimPrefix(s, rolePrefix)
		if !validRole(role) {
			return Identity{}, fmt.Errorf("pki: %q: the role must be lower-case letters", s)
		}
		return RoleIdentity(role), nil
	}
	return Identity{}, fmt.Errorf("pki: %q is not an urn:ursula: identity", s)
}

func validRole(r string) bool {
	if r == "" || len(r) > 32 {
		return false
	}
	for _, c := range r {
		if c < 'a' || c > 'z' {
			return false
		}
	}
	return true
}

// IdentityOf is the one identity cert proves.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var (
		found Identity
		n     int
	)
	for _, u := range cert.URIs {
		s := u.String()
		if !strings.HasPrefix(s, uriPrefix) {
			continue
		}
		id, err := ParseIdentity(s)
		if err != nil {
			return Identity{}, err
		}
		found = id
		n++
	}
	if n != 1 {
		return Identity{}, ErrNoIdentity
	}
	return found, nil
}

// PeerIdentity is the identity of the other end of a TLS connection: its
// leaf certificate, as verified against the CA. A connection whose peer
// sent no certificate, or one that was not verified, proves nothing.
func PeerIdentity(cs tls.ConnectionState) (Identity, error) {
	if len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return Identity{}, errors.New("pki: the peer presented no verified certificate")
	}
	return IdentityOf(cs.VerifiedChains[0][0])
}
