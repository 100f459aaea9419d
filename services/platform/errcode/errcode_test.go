package errcode

import (
	"errors"
	"net/http"
	"testing"

	errorsv1 "github.com/ursula/ursula/proto/gen/go/ursula/errors/v1"
)

// TestEveryCodeHasOneMapping: every code of the contract has a reason, an
// HTTP status and a gRPC code, and reasons round-trip.
func TestEveryCodeHasOneMapping(t *testing.T) {
	values := errorsv1.Code(0).Descriptor().Values()
	for i := 1; i < values.Len(); i++ {
		c := Code(values.Get(i).Number())
		reason := Reason(c)
		t.Run(reason, func(t *testing.T) {
			if got, ok := Parse(reason); !ok || got != c {
				t.Fatalf("Parse(%q) = %v, %v", reason, got, ok)
			}
			if s := HTTPStatus(c); s < 400 || s > 599 || http.StatusText(s) == "" {
				t.Fatalf("HTTP status %d", s)
			}
			if g := GRPCCode(c); g == 0 || g > 16 {
				t.Fatalf("gRPC code %d", g)
			}
		})
	}
}

func TestContract(t *testing.T) {
	tests := []struct {
		code   Code
		reason string
		http   int
		grpc   uint32
	}{
		{StreamNotFound, "STREAM_NOT_FOUND", 404, 5},
		{NotLeader, "NOT_LEADER", 409, 14},
		{OutcomeUnknown, "OUTCOME_UNKNOWN", 503, 14},
		{ColdStoreFailed, "COLD_STORE_FAILED", 502, 14},
		{ColdObjectCorrupt, "COLD_OBJECT_CORRUPT", 502, 15},
		{OffsetTrimmed, "OFFSET_TRIMMED", 410, 11},
		{IncarnationRequired, "INCARNATION_REQUIRED", 428, 9},
		{InvalidRequest, "INVALID_REQUEST", 400, 3},
	}
	for _, tc := range tests {
		t.Run(tc.reason, func(t *testing.T) {
			if Reason(tc.code) != tc.reason || HTTPStatus(tc.code) != tc.http || GRPCCode(tc.code) != tc.grpc {
				t.Fatalf("%v: reason %q http %d grpc %d", tc.code, Reason(tc.code), HTTPStatus(tc.code), GRPCCode(tc.code))
			}
		})
	}
	if _, ok := Parse("NO_SUCH_REASON"); ok {
		t.Fatal("an unknown reason parsed")
	}
	if HTTPStatus(Code(9999)) != 500 || Reason(Code(9999)) != "CODE(9999)" {
		t.Fatal("an unknown code is not a 500")
	}
}

func TestErrorIs(t *testing.T) {
	err := New(StreamClosed, "stream %s is closed", "s").With(KeyNextOffset, "x")
	if !errors.Is(err, &Error{Code: StreamClosed}) || errors.Is(err, &Error{Code: StreamGone}) {
		t.Fatal("errors.Is does not match by code")
	}
	if got, want := err.Error(), "STREAM_CLOSED: stream s is closed next_offset=x"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}
