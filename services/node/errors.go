package node

import (
	"errors"

	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/storage/fault"
)

// storageCodes is the node edge's one table from the storage engine's
// error kinds to the contract's codes. Every kind has a row
// (TestEveryStorageKindHasACode).
var storageCodes = map[*fault.Kind]errcode.Code{
	fault.ErrInvalidArgument:           errcode.InvalidArgument,
	fault.ErrBucketNotFound:            errcode.BucketNotFound,
	fault.ErrBucketExists:              errcode.BucketExists,
	fault.ErrStreamNotFound:            errcode.StreamNotFound,
	fault.ErrStreamGone:                errcode.StreamGone,
	fault.ErrStreamExists:              errcode.StreamExists,
	fault.ErrStreamClosed:              errcode.StreamClosed,
	fault.ErrContentTypeMismatch:       errcode.ContentTypeMismatch,
	fault.ErrStreamSeqConflict:         errcode.StreamSeqConflict,
	fault.ErrProducerStaleEpoch:        errcode.ProducerStaleEpoch,
	fault.ErrProducerSeqGap:            errcode.ProducerSeqGap,
	fault.ErrProducerEpochSeq:          errcode.ProducerEpochSeq,
	fault.ErrOffsetOutOfRange:          errcode.OffsetOutOfRange,
	fault.ErrForkSourceGone:            errcode.ForkSourceGone,
	fault.ErrIncarnationMismatch:       errcode.IncarnationMismatch,
	fault.ErrRecordMismatch:            errcode.RecordMismatch,
	fault.ErrPayloadTooLarge:           errcode.PayloadTooLarge,
	fault.ErrOffsetTrimmed:             errcode.OffsetTrimmed,
	fault.ErrSnapshotConflict:          errcode.SnapshotConflict,
	fault.ErrSnapshotNotFound:          errcode.SnapshotNotFound,
	fault.ErrNotLeader:                 errcode.NotLeader,
	fault.ErrOutcomeUnknown:            errcode.OutcomeUnknown,
	fault.ErrNotAVoter:                 errcode.NotAVoter,
	fault.ErrUnavailable:               errcode.Unavailable,
	fault.ErrOverloaded:                errcode.Overloaded,
	fault.ErrColdStoreFailed:           errcode.ColdStoreFailed,
	fault.ErrColdObjectCorrupt:         errcode.ColdObjectCorrupt,
	fault.ErrNoColdStore:               errcode.NoColdStore,
	fault.ErrUnimplemented:             errcode.Unimplemented,
	fault.ErrPermissionDenied:          errcode.PermissionDenied,
	fault.ErrTransferTargetNotEligible: errcode.TransferTargetNotEligible,
	fault.ErrInternal:                  errcode.Internal,
	fault.ErrGroupNotEmpty:             errcode.GroupNotEmpty,
	fault.ErrBackupMismatch:            errcode.BackupMismatch,
	fault.ErrColdGCHeld:                errcode.ColdGCHeld,
	fault.ErrFeatureLevelUnsupported:   errcode.FeatureLevelUnsupported,
}

// domainError converts an error of the storage engine into the contract's
// vocabulary; anything else passes through (a status, a context error, or
// a failure that answers INTERNAL).
func domainError(err error) error {
	var fe *fault.Error
	if errors.As(err, &fe) {
		return &errcode.Error{Code: codeOfKind(fe.Kind), Message: fe.Message, Metadata: fe.Details}
	}
	var k *fault.Kind
	if errors.As(err, &k) {
		return &errcode.Error{Code: codeOfKind(k), Message: err.Error()}
	}
	return err
}

func codeOfKind(k *fault.Kind) errcode.Code {
	if c, ok := storageCodes[k]; ok {
		return c
	}
	return errcode.Internal
}

// toStatus is the node's gRPC answer for err: the one place storage errors
// become wire errors.
func toStatus(err error) error { return grpcerr.ToStatus(domainError(err)) }
