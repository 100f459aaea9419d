package fault

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// Kind is a sentinel: one kind of failure.
type Kind struct {
	name string
	text string
}

func (k *Kind) Error() string { return "storage: " + k.text }

// Name is the kind's stable name.
func (k *Kind) Name() string { return k.name }

var kinds = map[string]*Kind{}

func newKind(name, text string) *Kind {
	k := &Kind{name: name, text: text}
	kinds[name] = k
	return k
}

// The kinds.
var (
	ErrInvalidArgument     = newKind("INVALID_ARGUMENT", "invalid argument")
	ErrBucketNotFound      = newKind("BUCKET_NOT_FOUND", "bucket not found")
	ErrBucketExists        = newKind("BUCKET_EXISTS", "bucket exists")
	ErrStreamNotFound      = newKind("STREAM_NOT_FOUND", "stream not found")
	ErrStreamGone          = newKind("STREAM_GONE", "stream deleted, forks still read it")
	ErrStreamExists        = newKind("STREAM_EXISTS", "stream exists with another configuration")
	ErrStreamClosed        = newKind("STREAM_CLOSED", "stream closed")
	ErrContentTypeMismatch = newKind("CONTENT_TYPE_MISMATCH", "content type mismatch")
	ErrStreamSeqConflict   = newKind("STREAM_SEQ_CONFLICT", "Stream-Seq conflict")
	ErrProducerStaleEpoch  = newKind("PRODUCER_STALE_EPOCH", "stale producer epoch")
	ErrProducerSeqGap      = newKind("PRODUCER_SEQ_GAP", "producer sequence gap")
	ErrProducerEpochSeq    = newKind("PRODUCER_EPOCH_SEQ", "a new producer epoch must start at sequence 0")
	ErrOffsetOutOfRange    = newKind("OFFSET_OUT_OF_RANGE", "offset out of range")
	ErrForkSourceGone      = newKind("FORK_SOURCE_GONE", "fork source gone")
	ErrIncarnationMismatch = newKind("INCARNATION_MISMATCH", "incarnation mismatch")
	ErrRecordMismatch      = newKind("RECORD_MISMATCH", "record mismatch")
	ErrPayloadTooLarge     = newKind("PAYLOAD_TOO_LARGE", "payload too large")
	ErrOffsetTrimmed       = newKind("OFFSET_TRIMMED", "offset below the retention")
	ErrSnapshotConflict    = newKind("SNAPSHOT_CONFLICT", "snapshot conflict")
	ErrSnapshotNotFound    = newKind("SNAPSHOT_NOT_FOUND", "snapshot not found")
	// ErrNotLeader: this node does not lead the group (DetailLeaderID
	// names the leader it knows of).
	ErrNotLeader = newKind("NOT_LEADER", "not the leader")
	// ErrOutcomeUnknown: leadership changed after a write was proposed; it
	// may or may not apply. Never retried on a caller's behalf.
	ErrOutcomeUnknown = newKind("OUTCOME_UNKNOWN", "outcome unknown")
	// ErrNotAVoter: the node a leadership transfer names is not a voter.
	ErrNotAVoter = newKind("NOT_A_VOTER", "not a voter of the group")
	// ErrTransferTargetNotEligible: the voter a leadership transfer names
	// may not take it now (drained, being rebuilt, unreachable, behind).
	ErrTransferTargetNotEligible = newKind("TRANSFER_TARGET_NOT_ELIGIBLE", "transfer target not eligible")
	// ErrUnavailable: retry later (DetailRetryAfterMS says when).
	ErrUnavailable = newKind("UNAVAILABLE", "unavailable")
	// ErrOverloaded: the group holds its cap of hot bytes.
	ErrOverloaded = newKind("OVERLOADED", "overloaded")
	// ErrColdStoreFailed: the object store failed a read of cold bytes.
	ErrColdStoreFailed = newKind("COLD_STORE_FAILED", "cold store failed")
	// ErrColdObjectCorrupt: a cold object's bytes differ from the
	// checksum its committed reference carries; none of them is served.
	ErrColdObjectCorrupt = newKind("COLD_OBJECT_CORRUPT", "cold object corrupt")
	// ErrNoColdStore: the operation needs a cold store; none is configured.
	ErrNoColdStore   = newKind("NO_COLD_STORE", "no cold store")
	ErrUnimplemented = newKind("UNIMPLEMENTED", "not implemented")
	// ErrPermissionDenied: the caller's proven identity may not do this.
	ErrPermissionDenied = newKind("PERMISSION_DENIED", "permission denied")
	// ErrInternal: a broken invariant; a bug, not the caller's fault.
	ErrInternal = newKind("INTERNAL", "internal error")
	// ErrGroupNotEmpty: an import into a group that holds buckets or
	// streams, was purged, or took another import.
	ErrGroupNotEmpty = newKind("GROUP_NOT_EMPTY", "group not empty")
	// ErrBackupMismatch: a group object of another backup format version,
	// cluster id or group count than this node's.
	ErrBackupMismatch = newKind("BACKUP_MISMATCH", "backup of another format, cluster or group count")
	// ErrColdGCHeld: a backup holds the cold GC; nothing deletes cold
	// objects until the hold ends (DetailRetryAfterMS).
	ErrColdGCHeld = newKind("COLD_GC_HELD", "cold GC held by a backup")
	// ErrFeatureLevelUnsupported: a feature level some node does not know
	// (a raise a voter cannot take), or a gated operation in a group whose
	// level is below the one it needs.
	ErrFeatureLevelUnsupported = newKind("FEATURE_LEVEL_UNSUPPORTED", "feature level unsupported")
)

// Detail keys. They are the contract's metadata keys (errors.proto), so
// the node passes details on as they are.
const (
	DetailNextOffset    = "next_offset"
	DetailClosed        = "closed"
	DetailProducerEpoch = "producer_epoch"
	DetailProducerSeq   = "producer_seq"
	DetailExpectedSeq   = "expected_seq"
	DetailReceivedSeq   = "received_seq"
	DetailLeaderID      = "leader_id"
	DetailLeaderAddr    = "leader_addr"
	DetailRetryAfterMS  = "retry_after_ms"
	DetailIncarnation   = "incarnation"
	DetailRecordNext    = "record_next"
	// DetailProducerOutcome says why a producer's epoch is fenced when it
	// is not a higher claim (ProducerOutcomeClosedByHistory).
	DetailProducerOutcome = "producer_outcome"
)

// ProducerOutcomeClosedByHistory is DetailProducerOutcome for an epoch a
// new history of the stream's group closed.
const ProducerOutcomeClosedByHistory = "epoch-closed;by=history"

// ByName returns the kind of a stable name.
func ByName(name string) (*Kind, bool) {
	k, ok := kinds[name]
	return k, ok
}

// Kinds returns every kind, by name.
func Kinds() []*Kind {
	out := make([]*Kind, 0, len(kinds))
	for _, k := range kinds {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// Error is a failure of one kind, with a message for people and details
// for protocols.
type Error struct {
	Kind    *Kind
	Message string
	Details map[string]string
}

// Errorf returns an error of kind k with a formatted message.
func Errorf(k *Kind, format string, args ...any) *Error {
	return &Error{Kind: k, Message: fmt.Sprintf(format, args...)}
}

// With adds a detail (e is modified and returned).
func (e *Error) With(key, value string) *Error {
	if e.Details == nil {
		e.Details = make(map[string]string, 2)
	}
	e.Details[key] = value
	return e
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Kind.Error())
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if len(e.Details) > 0 {
		keys := make([]string, 0, len(e.Details))
		for k := range e.Details {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%s", k, e.Details[k])
		}
	}
	return b.String()
}

// Unwrap makes errors.Is(err, kind) hold.
func (e *Error) Unwrap() error { return e.Kind }

// KindOf returns err's kind, or nil when err is none of them.
func KindOf(err error) *Kind {
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Kind
	}
	var k *Kind
	if errors.As(err, &k) {
		return k
	}
	return nil
}

// Detail returns a detail of err ("" without one).
func Detail(err error, key string) string {
	var fe *Error
	if errors.As(err, &fe) {
		return fe.Details[key]
	}
	return ""
}
