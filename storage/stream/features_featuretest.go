//go:build featuretest

package stream

import storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"

// A build made with -tags featuretest knows one level more than its
// release, with the test-only command FeatureProbe: the e2e upgrade test
// (tests/e2e/featurelevel_test.go) mixes such a build with the release's
// to prove that a rolling upgrade and downgrade work until the level is
// raised, and that a node that does not know a raised level refuses it.
const testFeatureLevels = 1

// FeatureProbeLevel is the level that turns FeatureProbe on.
const FeatureProbeLevel = releaseFeatureLevel + 1

// applyFeatureProbe counts the probe, in a group at FeatureProbeLevel.
func (m *Machine) applyFeatureProbe(*storagev1.FeatureProbe) *Result {
	if err := m.requireLevel(FeatureProbeLevel, "a feature probe"); err != nil {
		return &Result{Err: err}
	}
	m.featureProbes++
	return &Result{}
}
