//go:build !featuretest

package stream

import storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"

// testFeatureLevels is 0: a release build knows no test-only level.
const testFeatureLevels = 0

// applyFeatureProbe: a release build does not know the test-only command
// (nil: ErrUnknownCommand), as a release knows no command of a later one.
func (m *Machine) applyFeatureProbe(*storagev1.FeatureProbe) *Result { return nil }
