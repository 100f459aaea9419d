package grpcerr

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ursula/ursula/services/platform/errcode"
)

// Domain is the ErrorInfo domain of every Ursula error.
const Domain = "ursula"

// ToStatus converts err into a gRPC status error. Domain errors keep their
// code and metadata; context errors map to Canceled/DeadlineExceeded;
// anything else is INTERNAL.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var de *errcode.Error
	switch {
	case errors.As(err, &de):
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	default:
		de = &errcode.Error{Code: errcode.Internal, Message: err.Error()}
	}
	st := status.New(codes.Code(errcode.GRPCCode(de.Code)), de.Message)
	if withInfo, derr := st.WithDetails(&errdetails.ErrorInfo{
		Reason: errcode.Reason(de.Code), Domain: Domain, Metadata: de.Metadata,
	}); derr == nil {
		st = withInfo
	}
	return st.Err()
}

// FromStatus recovers the domain error from a gRPC error. A status without
// an Ursula ErrorInfo becomes a domain error derived from its gRPC code.
func FromStatus(err error) *errcode.Error {
	if err == nil {
		return nil
	}
	var de *errcode.Error
	if errors.As(err, &de) {
		return de
	}
	st, ok := status.FromError(err)
	if !ok {
		return &errcode.Error{Code: errcode.Internal, Message: err.Error()}
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			code, known := errcode.Parse(info.GetReason())
			if !known {
				// A newer peer's code: its gRPC code still says how to treat it.
				break
			}
			return &errcode.Error{Code: code, Message: st.Message(), Metadata: info.GetMetadata()}
		}
	}
	switch st.Code() {
	case codes.InvalidArgument:
		return &errcode.Error{Code: errcode.InvalidArgument, Message: st.Message()}
	case codes.NotFound:
		return &errcode.Error{Code: errcode.StreamNotFound, Message: st.Message()}
	case codes.Unavailable, codes.Canceled, codes.DeadlineExceeded:
		return &errcode.Error{Code: errcode.Unavailable, Message: st.Message()}
	case codes.ResourceExhausted:
		return &errcode.Error{Code: errcode.PayloadTooLarge, Message: st.Message()}
	default:
		return &errcode.Error{Code: errcode.Internal, Message: st.Message()}
	}
}
