// Package await is the one place tests wait for a condition: a test that
// needs something to happen polls for it here instead of sleeping for a
// guessed duration, so that it passes on a loaded machine as on an idle
// one and fails only when the condition truly never holds.
//
// Test files anywhere in the module may import it (it imports only the
// standard library); production code never does.
package await
