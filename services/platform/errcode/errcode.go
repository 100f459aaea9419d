package errcode

import (
	"fmt"
	"sort"
	"strings"
)

// Code is a stable, greppable error identifier.
type Code string

// Codes raised by the storage engine and the gateway.
const (
	InvalidArgument     Code = "INVALID_ARGUMENT"
	BucketNotFound      Code = "BUCKET_NOT_FOUND"
	BucketExists        Code = "BUCKET_EXISTS"
	StreamNotFound      Code = "STREAM_NOT_FOUND"
	StreamGone          Code = "STREAM_GONE"   // soft-deleted: forks still reference it
	StreamExists        Code = "STREAM_EXISTS" // exists with another configuration
	StreamClosed        Code = "STREAM_CLOSED" // append to a closed stream
	ContentTypeMismatch Code = "CONTENT_TYPE_MISMATCH"
	StreamSeqConflict   Code = "STREAM_SEQ_CONFLICT"
	ProducerStaleEpoch  Code = "PRODUCER_STALE_EPOCH"
	ProducerSeqGap      Code = "PRODUCER_SEQ_GAP"
	ProducerEpochSeq    Code = "PRODUCER_EPOCH_SEQ" // a new epoch must start at seq 0
	OffsetOutOfRange    Code = "OFFSET_OUT_OF_RANGE"
	ForkSourceGone      Code = "FORK_SOURCE_GONE"
	IncarnationMismatch Code = "INCARNATION_MISMATCH"
	RecordMismatch      Code = "RECORD_MISMATCH" // Stream-Record-Match is not the record tail
	PayloadTooLarge     Code = "PAYLOAD_TOO_LARGE"
	NotLeader           Code = "NOT_LEADER"
	OutcomeUnknown      Code = "OUTCOME_UNKNOWN"
	Unavailable         Code = "UNAVAILABLE"
	Overloaded          Code = "OVERLOADED"
	ColdStoreFailed     Code = "COLD_STORE_FAILED" // the object store failed a read of cold bytes
	OffsetTrimmed       Code = "OFFSET_TRIMMED"    // below the stream's retention
	Internal            Code = "INTERNAL"
	Unimplemented       Code = "UNIMPLEMENTED"
	SnapshotConflict    Code = "SNAPSHOT_CONFLICT"  // a snapshot publish that contradicts the stream or its latest snapshot
	SnapshotNotFound    Code = "SNAPSHOT_NOT_FOUND" // no snapshot (at that offset)
	NoColdStore         Code = "NO_COLD_STORE"      // the operation needs a cold store and none is configured
)

// Metadata keys carried next to a code.
const (
	KeyNextOffset    = "next_offset"
	KeyClosed        = "closed"
	KeyProducerEpoch = "producer_epoch"
	KeyProducerSeq   = "producer_seq"
	KeyExpectedSeq   = "expected_seq"
	KeyReceivedSeq   = "received_seq"
	KeyLeaderID      = "leader_id"
	KeyLeaderAddr    = "leader_addr"
	KeyRetryAfterMS  = "retry_after_ms"
	KeyIncarnation   = "incarnation"
	KeyRecordNext    = "record_next"
)

// Error is a domain error with a code, a human message and metadata.
type Error struct {
	Code     Code
	Message  string
	Metadata map[string]string
}

// New returns an error with a formatted message.
func New(code Code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// With returns e with one more metadata field (e is modified and returned).
func (e *Error) With(key, value string) *Error {
	if e.Metadata == nil {
		e.Metadata = make(map[string]string, 2)
	}
	e.Metadata[key] = value
	return e
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(string(e.Code))
	if e.Message != "" {
		b.WriteString(": ")
		b.WriteString(e.Message)
	}
	if len(e.Metadata) > 0 {
		keys := make([]string, 0, len(e.Metadata))
		for k := range e.Metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, " %s=%s", k, e.Metadata[k])
		}
	}
	return b.String()
}

// Is makes errors.Is match two *Error values by code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code
}
