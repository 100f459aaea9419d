// Package apicheck checks a server's real answers against its OpenAPI 3
// document: a Client sends requests, validates each request (unless it
// breaks the document on purpose) and each answer with kin-openapi's
// openapi3filter, fails the test on a request the document has no
// operation for, and reports the operations no request reached, so that a
// test can demand that every documented operation was exercised.
//
// Operations are matched by the Client itself, not by a kin-openapi router:
// a path parameter whose schema has pattern ".+" takes the rest of the
// path, slashes included (a stream id), and among the operations that
// match, the one with the fewest parameters, then the most literal
// characters, wins (/{bucket}/streams over /{bucket}/{stream}).
//
// Used by the admin plane's test (services/node) and the data plane's
// (tests/integration); it is one of the test-helper packages that tests
// outside tests/ may import (tests/layering).
package apicheck
