package grpcerr

import (
	"errors"
	"testing"

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
	for code := range grpcCodes {
		if got := FromStatus(ToStatus(errcode.New(code, "x"))); got.Code != code {
			t.Fatalf("%s round-trips as %s", code, got.Code)
		}
	}
}
