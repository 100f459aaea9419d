package subscription

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ursula/ursula/services/platform/errcode"
)

// tokenTTL is how long a callback or claim token stays valid. Fencing by
// generation and wake id is what retires a token in practice.
const tokenTTL = time.Hour

// signer holds the Ed25519 webhook signing key and the HMAC key for
// callback tokens.
type signer struct {
	priv     ed25519.PrivateKey
	kid      string
	x        string // base64url public key
	tokenKey []byte
}

type jwk struct {
	Kty string `json:"kty"`
	Crv string `json:"crv"`
	X   string `json:"x"`
	Kid string `json:"kid"`
	Use string `json:"use"`
	Alg string `json:"alg"`
}

type jwkSet struct {
	Keys []jwk `json:"keys"`
}

// newSigner loads the key at keyFile, creating it when missing; an empty
// keyFile gives an ephemeral key.
func newSigner(keyFile string) (*signer, error) {
	var priv ed25519.PrivateKey
	var err error
	if keyFile == "" {
		_, priv, err = ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, fmt.Errorf("generate signing key: %w", err)
		}
	} else if priv, err = loadOrCreateKey(keyFile); err != nil {
		return nil, err
	}
	tokenKey := make([]byte, 32)
	if _, err := rand.Read(tokenKey); err != nil {
		return nil, fmt.Errorf("generate token key: %w", err)
	}
	pub := priv.Public().(ed25519.PublicKey)
	x := base64.RawURLEncoding.EncodeToString(pub)
	// RFC 7638 thumbprint: members in lexicographic order, no whitespace.
	thumb := sha256.Sum256([]byte(`{"crv":"Ed25519","kty":"OKP","x":"` + x + `"}`))
	return &signer{
		priv:     priv,
		kid:      "ds_" + base64.RawURLEncoding.EncodeToString(thumb[:]),
		x:        x,
		tokenKey: tokenKey,
	}, nil
}

func loadOrCreateKey(path string) (ed25519.PrivateKey, error) {
	data, err := os.ReadFile(path)
	switch {
	case err == nil:
		block, _ := pem.Decode(data)
		if block == nil {
			return nil, fmt.Errorf("read signing key %s: no PEM block", path)
		}
		k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("parse signing key %s: %w", path, err)
		}
		priv, ok := k.(ed25519.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("parse signing key %s: not an Ed25519 key", path)
		}
		return priv, nil
	case errors.Is(err, fs.ErrNotExist):
	default:
		return nil, fmt.Errorf("read signing key %s: %w", path, err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate signing key: %w", err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		return nil, fmt.Errorf("encode signing key: %w", err)
	}
	pemBytes := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create signing key dir: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".webhook-key-*")
	if err != nil {
		return nil, fmt.Errorf("create signing key %s: %w", path, err)
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // best effort after rename
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("chmod signing key %s: %w", path, err)
	}
	if _, err := tmp.Write(pemBytes); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("write signing key %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return nil, fmt.Errorf("sync signing key %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return nil, fmt.Errorf("close signing key %s: %w", path, err)
	}
	// Link instead of rename so that a key created concurrently by another
	// process wins and both end up using the same one.
	if err := os.Link(tmp.Name(), path); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return loadOrCreateKey(path)
		}
		return nil, fmt.Errorf("install signing key %s: %w", path, err)
	}
	return priv, nil
}

// jwks returns the public key set served at __ds/jwks.json.
func (s *signer) jwks() jwkSet {
	return jwkSet{Keys: []jwk{{Kty: "OKP", Crv: "Ed25519", X: s.x, Kid: s.kid, Use: "sig", Alg: "EdDSA"}}}
}

// signatureHeader returns the Webhook-Signature value for body at time now:
// t=<unix>,kid=<kid>,ed25519=<base64url(sign("<unix>.<body>"))>.
func (s *signer) signatureHeader(body []byte, now time.Time) string {
	ts := strconv.FormatInt(now.Unix(), 10)
	msg := make([]byte, 0, len(ts)+1+len(body))
	msg = append(append(append(msg, ts...), '.'), body...)
	sig := ed25519.Sign(s.priv, msg)
	return "t=" + ts + ",kid=" + s.kid + ",ed25519=" + base64.RawURLEncoding.EncodeToString(sig)
}

// tokenClaims is the payload of a callback/claim token.
type tokenClaims struct {
	Sub  string `json:"sub"`
	Gen  uint64 `json:"gen"`
	Wake string `json:"wake"`
	Exp  int64  `json:"exp"`
	JTI  string `json:"jti"`
}

// issueToken returns base64url(json claims) "." base64url(hmac-sha256).
func (s *signer) issueToken(subID string, gen uint64, wakeID string, now time.Time) string {
	jti := make([]byte, 8)
	_, _ = rand.Read(jti)
	payload, _ := json.Marshal(tokenClaims{Sub: subID, Gen: gen, Wake: wakeID, Exp: now.Add(tokenTTL).Unix(), JTI: hex.EncodeToString(jti)})
	p := base64.RawURLEncoding.EncodeToString(payload)
	mac := hmac.New(sha256.New, s.tokenKey)
	mac.Write([]byte(p))
	return p + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

// verifyToken checks a token's MAC, subject and expiry and returns its
// claims, or the error code to answer with.
func (s *signer) verifyToken(token, subID string, now time.Time) (tokenClaims, errcode.Code) {
	p, sig, ok := strings.Cut(token, ".")
	if !ok {
		return tokenClaims{}, codeTokenInvalid
	}
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return tokenClaims{}, codeTokenInvalid
	}
	mac := hmac.New(sha256.New, s.tokenKey)
	mac.Write([]byte(p))
	if !hmac.Equal(got, mac.Sum(nil)) {
		return tokenClaims{}, codeTokenInvalid
	}
	raw, err := base64.RawURLEncoding.DecodeString(p)
	if err != nil {
		return tokenClaims{}, codeTokenInvalid
	}
	var c tokenClaims
	if err := json.Unmarshal(raw, &c); err != nil || c.Sub != subID {
		return tokenClaims{}, codeTokenInvalid
	}
	if now.Unix() > c.Exp {
		return tokenClaims{}, codeTokenExpired
	}
	return c, 0
}

// newWakeID returns a random wake identifier "w_<24 hex>".
func newWakeID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return "w_" + hex.EncodeToString(b)
}
