// Package proto holds Ursula's contracts: the .proto files under ursula/
// (one buf module, buf.build/ursula/ursula, buf.yaml) and, under gen/,
// the code `make generate` makes from them. This package has no code of
// its own; its tests check what another repository needs to generate from
// the files (a go_package on every file, a named module).
package proto
