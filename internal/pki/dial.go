package pki

import (
	"context"
	"fmt"
	"log/slog"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// ClientPlane is how a process (the gateway, the cold-GC worker, the
// backup service) proves itself to storage nodes' client plane.
type ClientPlane struct {
	// TLS dials the nodes over TLS: their certificates must chain to
	// ca_file and prove a node identity; cert_file and key_file, when
	// set, are this process's certificate (proving its role).
	TLS Files `toml:"tls"`
	// TokenFile names a file holding this process's bearer token (mode
	// 600, one token of at least 32 bytes), sent on every call.
	TokenFile string `toml:"token_file"`
	// Token is a bearer token handed over in process (the all-in-one
	// gateway calling its own node over loopback); never configured.
	Token string `toml:"-"`
}

// Validate checks the files named.
func (c ClientPlane) Validate(prefix string) error {
	if !c.TLS.IsZero() {
		if err := c.TLS.Validate(prefix+".tls", false); err != nil {
			return err
		}
	}
	if c.TokenFile != "" {
		if _, err := ReadTokenFile(c.TokenFile); err != nil {
			return fmt.Errorf("%s.token_file %s: %w", prefix, c.TokenFile, err)
		}
	}
	return nil
}

// DialOptions are the dial options of a client-plane connection: TLS (or
// plaintext when no TLS is configured) and the bearer token.
func (c ClientPlane) DialOptions(logger *slog.Logger) ([]grpc.DialOption, error) {
	var opts []grpc.DialOption
	if c.TLS.IsZero() {
		opts = append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))
	} else {
		src, err := Load(c.TLS, logger)
		if err != nil {
			return nil, err
		}
		opts = append(opts, grpc.WithTransportCredentials(credentials.NewTLS(src.ClientConfig(ExpectAnyNode))))
	}
	if c.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{header: "Bearer " + c.Token}))
	} else if c.TokenFile != "" {
		tok, err := ReadTokenFile(c.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("token_file %s: %w", c.TokenFile, err)
		}
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{header: "Bearer " + string(tok)}))
		clear(tok)
	}
	return opts, nil
}

// bearer sends a bearer token with every call. It is allowed over
// plaintext (a loopback development setup); configure TLS anywhere else.
type bearer struct{ header string }

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": b.header}, nil
}

func (bearer) RequireTransportSecurity() bool { return false }
