// Package layering checks the import rules of docs/architecture.md on the
// whole module: `make verify` and `make test` fail when an import breaks
// them. The rules are data (rules in layering_test.go), so adding one is a
// line; each rule says why it exists.
package layering
