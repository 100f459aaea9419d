package errcode

import (
	"fmt"
	"sort"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	errorsv1 "github.com/ursula/ursula/proto/gen/go/ursula/errors/v1"
)

// Code is a contract error code (proto/ursula/errors/v1).
type Code = errorsv1.Code

// The codes by their reasons; see errors.proto for what each means.
const (
	InvalidArgument           = errorsv1.Code_CODE_INVALID_ARGUMENT
	BucketNotFound            = errorsv1.Code_CODE_BUCKET_NOT_FOUND
	BucketExists              = errorsv1.Code_CODE_BUCKET_EXISTS
	StreamNotFound            = errorsv1.Code_CODE_STREAM_NOT_FOUND
	StreamGone                = errorsv1.Code_CODE_STREAM_GONE
	StreamExists              = errorsv1.Code_CODE_STREAM_EXISTS
	StreamClosed              = errorsv1.Code_CODE_STREAM_CLOSED
	ContentTypeMismatch       = errorsv1.Code_CODE_CONTENT_TYPE_MISMATCH
	StreamSeqConflict         = errorsv1.Code_CODE_STREAM_SEQ_CONFLICT
	ProducerStaleEpoch        = errorsv1.Code_CODE_PRODUCER_STALE_EPOCH
	ProducerSeqGap            = errorsv1.Code_CODE_PRODUCER_SEQ_GAP
	ProducerEpochSeq          = errorsv1.Code_CODE_PRODUCER_EPOCH_SEQ
	OffsetOutOfRange          = errorsv1.Code_CODE_OFFSET_OUT_OF_RANGE
	ForkSourceGone            = errorsv1.Code_CODE_FORK_SOURCE_GONE
	IncarnationMismatch       = errorsv1.Code_CODE_INCARNATION_MISMATCH
	RecordMismatch            = errorsv1.Code_CODE_RECORD_MISMATCH
	PayloadTooLarge           = errorsv1.Code_CODE_PAYLOAD_TOO_LARGE
	NotLeader                 = errorsv1.Code_CODE_NOT_LEADER
	OutcomeUnknown            = errorsv1.Code_CODE_OUTCOME_UNKNOWN
	Unavailable               = errorsv1.Code_CODE_UNAVAILABLE
	Overloaded                = errorsv1.Code_CODE_OVERLOADED
	ColdStoreFailed           = errorsv1.Code_CODE_COLD_STORE_FAILED
	OffsetTrimmed             = errorsv1.Code_CODE_OFFSET_TRIMMED
	Internal                  = errorsv1.Code_CODE_INTERNAL
	Unimplemented             = errorsv1.Code_CODE_UNIMPLEMENTED
	SnapshotConflict          = errorsv1.Code_CODE_SNAPSHOT_CONFLICT
	SnapshotNotFound          = errorsv1.Code_CODE_SNAPSHOT_NOT_FOUND
	NoColdStore               = errorsv1.Code_CODE_NO_COLD_STORE
	NotFound                  = errorsv1.Code_CODE_NOT_FOUND
	MethodNotAllowed          = errorsv1.Code_CODE_METHOD_NOT_ALLOWED
	Unauthenticated           = errorsv1.Code_CODE_UNAUTHENTICATED
	IncarnationRequired       = errorsv1.Code_CODE_INCARNATION_REQUIRED
	NotAVoter                 = errorsv1.Code_CODE_NOT_A_VOTER
	PeerClusterMismatch       = errorsv1.Code_CODE_PEER_CLUSTER_MISMATCH
	RaftProtocolMismatch      = errorsv1.Code_CODE_RAFT_PROTOCOL_MISMATCH
	InvalidRequest            = errorsv1.Code_CODE_INVALID_REQUEST
	SubscriptionNotFound      = errorsv1.Code_CODE_SUBSCRIPTION_NOT_FOUND
	SubscriptionAlreadyExists = errorsv1.Code_CODE_SUBSCRIPTION_ALREADY_EXISTS
	WebhookURLRejected        = errorsv1.Code_CODE_WEBHOOK_URL_REJECTED
	TokenInvalid              = errorsv1.Code_CODE_TOKEN_INVALID
	TokenExpired              = errorsv1.Code_CODE_TOKEN_EXPIRED
	Fenced                    = errorsv1.Code_CODE_FENCED
	AlreadyClaimed            = errorsv1.Code_CODE_ALREADY_CLAIMED
	NoPendingWork             = errorsv1.Code_CODE_NO_PENDING_WORK
	InvalidOffset             = errorsv1.Code_CODE_INVALID_OFFSET
	LimitExceeded             = errorsv1.Code_CODE_LIMIT_EXCEEDED
	RequestTimeout            = errorsv1.Code_CODE_REQUEST_TIMEOUT
	PermissionDenied          = errorsv1.Code_CODE_PERMISSION_DENIED
	TransferTargetNotEligible = errorsv1.Code_CODE_TRANSFER_TARGET_NOT_ELIGIBLE
	ColdObjectCorrupt         = errorsv1.Code_CODE_COLD_OBJECT_CORRUPT
	GroupNotEmpty             = errorsv1.Code_CODE_GROUP_NOT_EMPTY
	BackupMismatch            = errorsv1.Code_CODE_BACKUP_MISMATCH
	ColdGCHeld                = errorsv1.Code_CODE_COLD_GC_HELD
	FeatureLevelUnsupported   = errorsv1.Code_CODE_FEATURE_LEVEL_UNSUPPORTED
)

// Metadata keys carried next to a code (errors.proto lists them).
const (
	KeyNextOffset         = "next_offset"
	KeyClosed             = "closed"
	KeyProducerEpoch      = "producer_epoch"
	KeyProducerSeq        = "producer_seq"
	KeyExpectedSeq        = "expected_seq"
	KeyReceivedSeq        = "received_seq"
	KeyLeaderID           = "leader_id"
	KeyLeaderAddr         = "leader_addr"
	KeyRetryAfterMS       = "retry_after_ms"
	KeyIncarnation        = "incarnation"
	KeyRecordNext         = "record_next"
	KeyProcessIncarnation = "process_incarnation"
	KeyProducerOutcome    = "producer_outcome"
)

// reasonPrefix is what a code's value name has and its reason has not.
const reasonPrefix = "CODE_"

// contract is what errors.proto says of each code, read once from its
// descriptor: the proto file is the one table.
type contract struct {
	reason     string
	httpStatus int
	grpcCode   uint32
}

var (
	contracts = map[Code]contract{}
	byReason  = map[string]Code{}
)

func init() {
	values := errorsv1.Code(0).Descriptor().Values()
	for i := range values.Len() {
		v := values.Get(i)
		c := Code(v.Number())
		k := contract{
			reason:     strings.TrimPrefix(string(v.Name()), reasonPrefix),
			httpStatus: int(optionUint(v, errorsv1.E_HttpStatus)),
			grpcCode:   optionUint(v, errorsv1.E_GrpcCode),
		}
		contracts[c] = k
		if c != errorsv1.Code_CODE_UNSPECIFIED {
			byReason[k.reason] = c
		}
	}
}

func optionUint(v protoreflect.EnumValueDescriptor, ext protoreflect.ExtensionType) uint32 {
	n, _ := proto.GetExtension(v.Options(), ext).(uint32)
	return n
}

// Reason is a code's name on the wire ("STREAM_NOT_FOUND").
func Reason(c Code) string {
	if k, ok := contracts[c]; ok {
		return k.reason
	}
	return fmt.Sprintf("CODE(%d)", int32(c))
}

// Parse returns the code of a reason.
func Parse(reason string) (Code, bool) {
	c, ok := byReason[reason]
	return c, ok
}

// HTTPStatus is a code's status on every HTTP surface (500 for a code this
// build does not know).
func HTTPStatus(c Code) int {
	if k, ok := contracts[c]; ok && k.httpStatus != 0 {
		return k.httpStatus
	}
	return 500
}

// GRPCCode is a code's gRPC status code number (2, Unknown, for a code
// this build does not know).
func GRPCCode(c Code) uint32 {
	if k, ok := contracts[c]; ok && c != errorsv1.Code_CODE_UNSPECIFIED {
		return k.grpcCode
	}
	return 2
}

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
	b.WriteString(Reason(e.Code))
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
