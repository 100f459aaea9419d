// Package errcode names the domain error codes that cross process
// boundaries. A code travels as the reason of a gRPC ErrorInfo detail and as
// the "code" field of an HTTP JSON error body; metadata keys carry the
// protocol fields an error needs (the final offset of a closed stream, the
// expected producer sequence, the leader to retry at).
//
// The storage engine raises *Error values; services/platform/grpcerr turns
// them into gRPC statuses (one table) and back; the gateway turns statuses
// into HTTP responses (one table).
package errcode
