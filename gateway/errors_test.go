package gateway

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

func TestWriteErrorTable(t *testing.T) {
	tests := []struct {
		name    string
		err     *errcode.Error
		status  int
		headers map[string]string
	}{
		{"invalid", errcode.New(errcode.InvalidArgument, "bad"), 400, nil},
		{"bucket missing", errcode.New(errcode.BucketNotFound, "x"), 404, nil},
		{"bucket exists", errcode.New(errcode.BucketExists, "x"), 409, nil},
		{"stream missing", errcode.New(errcode.StreamNotFound, "x"), 404, nil},
		{"gone", errcode.New(errcode.StreamGone, "x"), 410, nil},
		{"exists", errcode.New(errcode.StreamExists, "x"), 409, nil},
		{"closed", errcode.New(errcode.StreamClosed, "x").With(errcode.KeyNextOffset, "0_9"), 409,
			map[string]string{"Stream-Closed": "true", "Stream-Next-Offset": "0_9"}},
		{"content type", errcode.New(errcode.ContentTypeMismatch, "x"), 409, nil},
		{"seq", errcode.New(errcode.StreamSeqConflict, "x"), 409, nil},
		{"stale epoch", errcode.New(errcode.ProducerStaleEpoch, "x").With(errcode.KeyProducerEpoch, "4"), 403,
			map[string]string{"Producer-Epoch": "4"}},
		{"epoch closed", errcode.New(errcode.ProducerStaleEpoch, "x").With(errcode.KeyProducerEpoch, "4").
			With(errcode.KeyProducerSeq, "9").With(errcode.KeyProducerOutcome, "epoch-closed;by=history"), 403,
			map[string]string{"Producer-Epoch": "4", "Producer-Seq": "9", "Producer-Outcome": "epoch-closed;by=history"}},
		{"seq gap", errcode.New(errcode.ProducerSeqGap, "x").With(errcode.KeyExpectedSeq, "3").With(errcode.KeyReceivedSeq, "5"), 409,
			map[string]string{"Producer-Expected-Seq": "3", "Producer-Received-Seq": "5"}},
		{"epoch seq", errcode.New(errcode.ProducerEpochSeq, "x"), 400, nil},
		{"offset range", errcode.New(errcode.OffsetOutOfRange, "x"), 400, nil},
		{"fork source gone", errcode.New(errcode.ForkSourceGone, "x"), 409, nil},
		{"incarnation", errcode.New(errcode.IncarnationMismatch, "x").With(errcode.KeyIncarnation, "40"), 412,
			map[string]string{"Stream-Incarnation": "40"}},
		{"too large", errcode.New(errcode.PayloadTooLarge, "x"), 413, nil},
		{"not leader", errcode.New(errcode.NotLeader, "x"), 503, map[string]string{"Retry-After": "1"}},
		{"outcome unknown", errcode.New(errcode.OutcomeUnknown, "x"), 503, nil},
		{"unavailable", errcode.New(errcode.Unavailable, "x"), 503, map[string]string{"Retry-After": "1"}},
		{"overloaded", errcode.New(errcode.Overloaded, "x").With(errcode.KeyRetryAfterMS, "2500"), 503, map[string]string{"Retry-After": "3"}},
		{"internal", errcode.New(errcode.Internal, "x"), 500, nil},
		{"unknown code", errcode.New(errcode.Code(9999), "x"), 500, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Through a real gRPC status, as errors arrive from the node.
			rec := httptest.NewRecorder()
			writeError(rec, grpcerr.ToStatus(tt.err))
			if rec.Code != tt.status {
				t.Fatalf("status = %d, want %d", rec.Code, tt.status)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Fatalf("Content-Type = %q", ct)
			}
			for k, v := range tt.headers {
				if got := rec.Header().Get(k); got != v {
					t.Fatalf("%s = %q, want %q", k, got, v)
				}
			}
			var body errorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatalf("body %q: %v", rec.Body.String(), err)
			}
			want := errcode.Reason(tt.err.Code)
			switch tt.err.Code {
			case errcode.NotLeader:
				want = "UNAVAILABLE" // the gateway routes; its client sees a group without a reachable leader
			case errcode.Code(9999):
				want = "INTERNAL" // a code this build does not know
			}
			if body.Code != want || (tt.err.Code != errcode.NotLeader && body.Message != tt.err.Message) {
				t.Fatalf("body = %+v", body)
			}
		})
	}
}

func TestToDomain(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want errcode.Code
	}{
		{"domain", errcode.New(errcode.StreamGone, "x"), errcode.StreamGone},
		{"plain grpc not found", status.Error(codes.NotFound, "x"), errcode.StreamNotFound},
		{"plain grpc unavailable", status.Error(codes.Unavailable, "x"), errcode.Unavailable},
		{"grpc resource exhausted", status.Error(codes.ResourceExhausted, "too big"), errcode.PayloadTooLarge},
		{"max bytes", &http.MaxBytesError{Limit: 10}, errcode.PayloadTooLarge},
		{"other", errors.New("boom"), errcode.Internal},
		{"not leader", grpcerr.ToStatus(errcode.New(errcode.NotLeader, "x").With(errcode.KeyLeaderID, "2")), errcode.Unavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := toDomain(tt.err); got.Code != tt.want {
				t.Fatalf("toDomain = %v, want %s", got, tt.want)
			}
		})
	}
}
