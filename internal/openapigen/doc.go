// Command openapigen builds the OpenAPI 3 documents the servers serve, as
// part of `make generate`:
//
//   - the admin plane's (services/node/openapi/admin.json): the OpenAPI 2
//     draft protoc-gen-openapiv2 derives from AdminService (buf.gen.admin.yaml),
//     converted to OpenAPI 3 and made to say what the node sends — 64-bit
//     integers as JSON numbers (the node's adminJSON marshaler), every
//     field of an answer present, the error schema and responses, the
//     process-incarnation header of mutations — merged with the hand-kept
//     part (services/node/openapi/admin.yaml: the error schema and the
//     routes served by hand-written handlers). The draft is deleted.
//   - the data plane's (gateway/openapi.json): gateway/openapi.yaml,
//     hand-kept, validated and written as JSON.
//
// Both outputs are validated as OpenAPI 3 and written deterministically
// (sorted keys), so that `make verify` sees drift. Run from the module root:
//
//	go run ./internal/openapigen
package main
