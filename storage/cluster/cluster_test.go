package cluster

import (
	"context"
	"errors"
	"fmt"
	"testing"

	raftv1 "github.com/ursula/ursula/proto/gen/go/ursula/raft/v1"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/multiraft"
)

// TestRaftError: the one translation of the Raft host's errors.
func TestRaftError(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		kind   *fault.Kind
		leader string
		retry  string
	}{
		{"not leader", &multiraft.NotLeaderError{LeaderID: 3}, fault.ErrNotLeader, "3", "200"},
		{"not leader, leader unknown", &multiraft.NotLeaderError{}, fault.ErrNotLeader, "", "200"},
		{"outcome unknown", multiraft.ErrOutcomeUnknown, fault.ErrOutcomeUnknown, "", ""},
		{"not a voter", fmt.Errorf("transfer: %w", multiraft.ErrNotVoter), fault.ErrNotAVoter, "", ""},
		{"snapshot failed", multiraft.ErrSnapshotFailed, fault.ErrInternal, "", ""},
		{"unknown group", multiraft.ErrUnknownGroup, fault.ErrInvalidArgument, "", ""},
		{"worker busy", fmt.Errorf("%w: busy", multiraft.ErrNotStarted), fault.ErrUnavailable, "", "1000"},
		{"stopped", multiraft.ErrStopped, fault.ErrUnavailable, "", "1000"},
		{"dropped", multiraft.ErrProposalDropped, fault.ErrUnavailable, "", "1000"},
		{"storage errors pass", fault.Errorf(fault.ErrStreamClosed, "x"), fault.ErrStreamClosed, "", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := raftError(tc.err)
			if fault.KindOf(err) != tc.kind {
				t.Fatalf("raftError(%v) = %v, want kind %s", tc.err, err, tc.kind.Name())
			}
			if got := fault.Detail(err, fault.DetailLeaderID); got != tc.leader {
				t.Errorf("leader_id %q, want %q", got, tc.leader)
			}
			if got := fault.Detail(err, fault.DetailRetryAfterMS); got != tc.retry {
				t.Errorf("retry_after_ms %q, want %q", got, tc.retry)
			}
		})
	}
	if err := raftError(context.Canceled); !errors.Is(err, context.Canceled) {
		t.Fatalf("a context error became %v", err)
	}
	if raftError(nil) != nil {
		t.Fatal("nil became an error")
	}
}

// TestForwardErrorsRoundTrip: a refusal travels between nodes in the
// answer and comes back as the same kind with its details.
func TestForwardErrorsRoundTrip(t *testing.T) {
	in := fault.Errorf(fault.ErrNotLeader, "moved").With(fault.DetailLeaderID, "2")
	out := decodeError(encodeError(fmt.Errorf("propose: %w", in)))
	if !errors.Is(out, fault.ErrNotLeader) || fault.Detail(out, fault.DetailLeaderID) != "2" {
		t.Fatalf("round trip gave %v", out)
	}
	if out := decodeError(encodeError(errors.New("boom"))); !errors.Is(out, fault.ErrUnavailable) {
		t.Fatalf("a plain error came back as %v, want unavailable", out)
	}
	if out := decodeError(&raftv1.ForwardError{Kind: "FROM_A_NEWER_RELEASE"}); !errors.Is(out, fault.ErrUnavailable) {
		t.Fatalf("an unknown kind came back as %v, want unavailable", out)
	}
}
