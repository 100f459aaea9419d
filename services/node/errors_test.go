package node

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/transport"
)

func TestEveryStorageKindHasACode(t *testing.T) {
	for _, k := range fault.Kinds() {
		if _, ok := storageCodes[k]; !ok {
			t.Errorf("storage kind %s has no contract code", k.Name())
		}
	}
}

func TestToStatus(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want errcode.Code
		md   map[string]string
	}{
		{"kind with details", fault.Errorf(fault.ErrStreamClosed, "closed").With(fault.DetailNextOffset, "0_9"), errcode.StreamClosed, map[string]string{errcode.KeyNextOffset: "0_9"}},
		{"bare kind", fault.ErrOverloaded, errcode.Overloaded, nil},
		{"wrapped", errors.Join(errors.New("context"), fault.Errorf(fault.ErrNotLeader, "x").With(fault.DetailLeaderID, "2")), errcode.NotLeader, map[string]string{errcode.KeyLeaderID: "2"}},
		{"plain error", errors.New("boom"), errcode.Internal, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			de := grpcerr.FromStatus(toStatus(tc.err))
			if de.Code != tc.want {
				t.Fatalf("code %v, want %v", de.Code, tc.want)
			}
			for k, v := range tc.md {
				if de.Metadata[k] != v {
					t.Fatalf("metadata %s = %q, want %q", k, de.Metadata[k], v)
				}
			}
		})
	}
}

// TestStorageKindsOnTheWire: the gRPC status codes of storage refusals a
// client of the node plane acts on (the issue: input that could lose data
// answers INVALID_ARGUMENT; a cold object that fails its checksum
// DATA_LOSS, 502 over HTTP).
func TestStorageKindsOnTheWire(t *testing.T) {
	tests := []struct {
		kind *fault.Kind
		grpc codes.Code
		http int
	}{
		{fault.ErrInvalidArgument, codes.InvalidArgument, 400},
		{fault.ErrColdObjectCorrupt, codes.DataLoss, 502},
		{fault.ErrColdStoreFailed, codes.Unavailable, 502},
	}
	for _, tc := range tests {
		t.Run(tc.kind.Name(), func(t *testing.T) {
			st := toStatus(fault.Errorf(tc.kind, "x"))
			if got := status.Code(st); got != tc.grpc {
				t.Fatalf("gRPC code %v, want %v", got, tc.grpc)
			}
			if got := errcode.HTTPStatus(grpcerr.FromStatus(st).Code); got != tc.http {
				t.Fatalf("HTTP status %d, want %d", got, tc.http)
			}
		})
	}
}

// TestClusterRefusalReasons: the cluster plane's refusals carry contract
// reasons.
func TestClusterRefusalReasons(t *testing.T) {
	for _, reason := range []string{transport.ReasonPeerClusterMismatch, transport.ReasonProtocolMismatch} {
		c, ok := errcode.Parse(reason)
		if !ok || errcode.GRPCCode(c) != uint32(codes.FailedPrecondition) {
			t.Errorf("refusal reason %q: contract code %v (%v), gRPC %d", reason, c, ok, errcode.GRPCCode(c))
		}
	}
}
