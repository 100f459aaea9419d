package backup

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"testing"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/coldfmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestVerifyRef(t *testing.T) {
	chunk, chunkCRC := coldfmt.EncodeChunk(100, [][]byte{[]byte("hello "), []byte("world\n")}, []uint64{112})
	page, pageCRC := coldfmt.EncodePage([]*storagev1.ColdRef{{Start: 0, End: 10, Key: "k", Crc32C: 7}})
	part := []byte("snapshot part")
	sum := sha256.Sum256(part)
	flip := func(b []byte, i int) []byte {
		c := append([]byte(nil), b...)
		c[i] ^= 1
		return c
	}
	crc := func(v uint32) string { return fmt.Sprintf("crc32c:%08x", v) }
	for _, tc := range []struct {
		name string
		ref  backupfmt.Ref
		body []byte
		ok   bool
	}{
		{"chunk", backupfmt.Ref{Key: "c", Size: uint64(len(chunk)), Check: crc(chunkCRC)}, chunk, true},
		{"chunk data flipped", backupfmt.Ref{Key: "c", Size: uint64(len(chunk)), Check: crc(chunkCRC)}, flip(chunk, 2), false},
		{"chunk footer flipped", backupfmt.Ref{Key: "c", Size: uint64(len(chunk)), Check: crc(chunkCRC)}, flip(chunk, len(chunk)-10), false},
		{"chunk of another reference", backupfmt.Ref{Key: "c", Size: uint64(len(chunk)), Check: crc(chunkCRC + 1)}, chunk, false},
		{"truncated", backupfmt.Ref{Key: "c", Size: uint64(len(chunk)), Check: crc(chunkCRC)}, chunk[:len(chunk)-1], false},
		{"page", backupfmt.Ref{Key: "p", Size: uint64(len(page)), Check: crc(pageCRC)}, page, true},
		{"page flipped", backupfmt.Ref{Key: "p", Size: uint64(len(page)), Check: crc(pageCRC)}, flip(page, 1), false},
		{"part", backupfmt.Ref{Key: "s", Size: uint64(len(part)), Check: "sha256:" + hex.EncodeToString(sum[:])}, part, true},
		{"part flipped", backupfmt.Ref{Key: "s", Size: uint64(len(part)), Check: "sha256:" + hex.EncodeToString(sum[:])}, flip(part, 0), false},
		{"no check", backupfmt.Ref{Key: "s", Size: 3}, []byte("abc"), true},
		{"no check, other size", backupfmt.Ref{Key: "s", Size: 4}, []byte("abc"), false},
		{"unknown check", backupfmt.Ref{Key: "s", Check: "xxh3:1"}, []byte("abc"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := verifyRef(tc.ref, tc.body); (err == nil) != tc.ok {
				t.Fatalf("verifyRef: %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		want   answer
		leader uint64
	}{
		{"not leader", grpcerr.ToStatus(errcode.New(errcode.NotLeader, "x").With(errcode.KeyLeaderID, "3")), answerNotLeader, 3},
		{"not leader as failed precondition", withReason(codes.FailedPrecondition, "NOT_LEADER", "2"), answerNotLeader, 2},
		{"not leader, no hint", grpcerr.ToStatus(errcode.New(errcode.NotLeader, "x")), answerNotLeader, 0},
		{"unavailable", grpcerr.ToStatus(errcode.New(errcode.Unavailable, "x")), answerRetry, 0},
		{"outcome unknown", grpcerr.ToStatus(errcode.New(errcode.OutcomeUnknown, "x")), answerRetry, 0},
		{"connection refused", status.Error(codes.Unavailable, "refused"), answerRetry, 0},
		{"invalid", grpcerr.ToStatus(errcode.New(errcode.InvalidArgument, "x")), answerInvalid, 0},
		{"group not empty (a code this build does not know)", withReason(codes.FailedPrecondition, "GROUP_NOT_EMPTY", ""), answerConflict, 0},
		{"internal", status.Error(codes.Internal, "x"), answerFail, 0},
		{"not a status", fmt.Errorf("plain"), answerFail, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, l := classify(tc.err)
			if a != tc.want || l != tc.leader {
				t.Fatalf("classify: %v %d, want %v %d", a, l, tc.want, tc.leader)
			}
		})
	}
}

// withReason is a status carrying an ErrorInfo reason, as a node of a
// newer build may send.
func withReason(code codes.Code, reason, leader string) error {
	info := &errdetails.ErrorInfo{Reason: reason, Domain: grpcerr.Domain}
	if leader != "" {
		info.Metadata = map[string]string{errcode.KeyLeaderID: leader}
	}
	st, err := status.New(code, reason).WithDetails(info)
	if err != nil {
		panic(err)
	}
	return st.Err()
}
