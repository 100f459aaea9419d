package node

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"

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
