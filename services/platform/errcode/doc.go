// Package errcode is the error vocabulary of the services and the gateway:
// the contract codes of proto/ursula/errors/v1 with their reasons, their one
// HTTP status and their one gRPC code, all read from errors.proto's
// options (so the proto file is the only table), and *Error, a code with a
// message and metadata.
//
// A code travels as the reason of a gRPC ErrorInfo detail
// (services/platform/grpcerr) and as the "code" field of an HTTP JSON error
// body; metadata keys carry the protocol fields an error needs (the final
// offset of a closed stream, the expected producer sequence, the leader to
// retry at). The storage engine does not use this package: it returns its
// own sentinel errors, which the node maps to codes at its edge.
package errcode
