// Package grpcerr converts domain errors (errcode.Error) to gRPC statuses and
// back. The status code is the contract's (errors.proto, through errcode);
// the domain code and its metadata travel in an ErrorInfo detail, so a
// caller recovers the exact error, not just the gRPC code.
package grpcerr
