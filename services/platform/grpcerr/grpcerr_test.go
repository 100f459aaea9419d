package grpcerr

import (
	"errors"
	"testing"

	"google.golang.org/grpc/status"

	errorsv1 "github.com/ursula/ursula/proto/gen/go/ursula/errors/v1"

	"github.com/ursula/ursula/services/platform/errcode"
)

func TestRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		in   error
		want errcode.Code
	}{
		{"domain error keeps code", errcode.New(errcode.StreamClosed, "closed").With(errcode.KeyNextOffset, "0000000000000000_0000000000000005"), errcode.StreamClosed},
		{"plain error is internal", errors.New("boom"), errcode.Internal},
		{"every table entry", errcode.New(errcode.ProducerSeqGap, "gap").With(errcode.KeyExpectedSeq, "3"), errcode.ProducerSeqGap},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := FromStatus(ToStatus(tc.in))
			if got.Code != tc.want {
				t.Fatalf("code = %s, want %s", got.Code, tc.want)
			}
			var de *errcode.Error
			if errors.As(tc.in, &de) {
				for k, v := range de.Metadata {
					if got.Metadata[k] != v {
						t.Fatalf("metadata %s = %q, want %q", k, got.Metadata[k], v)
					}
				}
			}
		})
	}
	values := errorsv1.Code(0).Descriptor().Values()
	for i := 1; i < values.Len(); i++ {
		code := errcode.Code(values.Get(i).Number())
		err := ToStatus(errcode.New(code, "x"))
		if got := FromStatus(err); got.Code != code {
			t.Fatalf("%s round-trips as %s", code, got.Code)
		}
		if got := status.Code(err); uint32(got) != errcode.GRPCCode(code) {
			t.Fatalf("%s has gRPC code %v, want %d", code, got, errcode.GRPCCode(code))
		}
	}
}
