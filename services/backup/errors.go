package backup

import (
	"errors"
	"strconv"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// The errors callers map to exit codes (errors.Is). Every error the
// package returns for one of these conditions wraps the sentinel, with a
// message that names the object, group or node concerned.
var (
	// ErrPrecondition: the cluster does not fit the backup or the backup
	// does not fit this build (cluster id, group count or format version
	// mismatch, a target group that is not empty, nodes that disagree).
	// Restore checks everything it can before its first import.
	ErrPrecondition = errors.New("backup: precondition failed")
	// ErrCorrupt: an object's size or BLAKE3 digest is not the one the
	// manifest (or an export) says, or an object does not decode.
	ErrCorrupt = errors.New("backup: corrupt")
	// ErrMissingCold: the target cluster's cold store lacks objects the
	// backup's groups reference.
	ErrMissingCold = errors.New("backup: cold objects missing")
	// ErrLocked: another writer holds the location's lock.
	ErrLocked = errors.New("backup: location locked")
	// ErrNotFound: no such backup (or no complete backup at all).
	ErrNotFound = errors.New("backup: not found")
)

// answer is how a node's refusal is handled.
type answer int

const (
	// answerFail: give up (the error is returned).
	answerFail answer = iota
	// answerNotLeader: call the leader (leaderID when known) instead.
	answerNotLeader
	// answerRetry: the node or group is briefly unable to answer (no
	// leader, overloaded, a lost outcome of an idempotent call); try again
	// after a pause, possibly on another node.
	answerRetry
	// answerInvalid: the node refused the request's content.
	answerInvalid
	// answerConflict: the node refused because of the group's state (an
	// import into a group that holds buckets).
	answerConflict
)

// classify reads a node's error. It reads the ErrorInfo reason before the
// status code: NOT_LEADER travels as UNAVAILABLE in the error contract, and
// a code this build does not know yet (the import's "group not empty")
// still says through its gRPC code how to treat it.
func classify(err error) (answer, uint64) {
	st, ok := status.FromError(err)
	if !ok {
		return answerFail, 0
	}
	for _, d := range st.Details() {
		info, ok := d.(*errdetails.ErrorInfo)
		if !ok || info.GetDomain() != grpcerr.Domain {
			continue
		}
		switch info.GetReason() {
		case errcode.Reason(errcode.NotLeader):
			id, _ := strconv.ParseUint(info.GetMetadata()[errcode.KeyLeaderID], 10, 64)
			return answerNotLeader, id
		case errcode.Reason(errcode.OutcomeUnknown), errcode.Reason(errcode.Unavailable), errcode.Reason(errcode.Overloaded):
			return answerRetry, 0
		}
	}
	switch st.Code() {
	case codes.Unavailable:
		return answerRetry, 0
	case codes.InvalidArgument:
		return answerInvalid, 0
	case codes.FailedPrecondition, codes.Aborted, codes.AlreadyExists:
		return answerConflict, 0
	}
	return answerFail, 0
}
