package stream

import (
	"errors"
	"fmt"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

// Feature levels (package doc, "Feature levels"). A level names the set of
// replicated behaviours a group's leader may use: commands and snapshot
// fields a release added. A group starts at the baseline and an operator
// raises it (SetFeatureLevel in every group) once every voter runs a
// release that knows the level; a release never proposes anything its
// group's level does not allow, so an older replica never meets a command
// it does not know in a group it can still apply.
const (
	// BaselineFeatureLevel is the level of a group never raised: what
	// every release since feature levels, and the one before, applies.
	BaselineFeatureLevel uint32 = 1
	// releaseFeatureLevel is the highest level this release defines. A
	// new gated behaviour bumps it (docs/architecture.md, "Feature
	// levels"). A fresh install starts its groups there (package
	// cluster, init.go); an upgraded cluster stays where it was until an
	// operator raises it.
	releaseFeatureLevel uint32 = 2
	// ReleaseFeatureLevel is releaseFeatureLevel, for the install.
	ReleaseFeatureLevel = releaseFeatureLevel
	// BucketFenceLevel turns on the bucket-delete fences (FenceBucket,
	// CreateStream.bucket_generation; buckets.go). Below it a bucket
	// delete checks the groups without fencing them, and a create racing
	// it in another group can land in the deleted bucket.
	BucketFenceLevel uint32 = 2
	// MaxFeatureLevel is the highest level this build knows: the
	// release's, plus the test-only level of a build made with
	// -tags featuretest (featuretest.go).
	MaxFeatureLevel = releaseFeatureLevel + testFeatureLevels
)

// ErrFeatureLevelUnsupported reports a group whose feature level this
// build does not know (errors.Is of a *FeatureLevelError).
var ErrFeatureLevelUnsupported = errors.New("stream: feature level this build does not know")

// FeatureLevelError reports a committed entry or a snapshot that raises a
// group above MaxFeatureLevel. Nothing of it is applied: the replica must
// stop applying the group (HaltGroup), because every later entry may use
// behaviours this build does not have; the other replicas go on.
type FeatureLevelError struct {
	Group uint32
	// Level is the level the group reached; Index the entry (0: a
	// snapshot) that raised it.
	Level uint32
	Index uint64
}

func (e *FeatureLevelError) Error() string {
	at := "a snapshot"
	if e.Index != 0 {
		at = fmt.Sprintf("entry %d", e.Index)
	}
	return fmt.Sprintf("stream: group %d is raised to feature level %d by %s; this build knows feature levels up to %d", e.Group, e.Level, at, MaxFeatureLevel)
}

// Unwrap makes errors.Is(err, ErrFeatureLevelUnsupported) hold.
func (e *FeatureLevelError) Unwrap() error { return ErrFeatureLevelUnsupported }

// HaltGroup tells the Raft host to stop applying the group on this node
// instead of stopping the node (package multiraft, "Errors").
func (e *FeatureLevelError) HaltGroup() bool { return true }

// effectiveLevel is the level a stored value stands for: 0 (never raised,
// or a snapshot from before levels) is the baseline.
func effectiveLevel(stored uint32) uint32 { return max(stored, BaselineFeatureLevel) }

// FeatureLevel is the group's feature level, as this replica applied it.
func (m *Machine) FeatureLevel() uint32 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return effectiveLevel(m.featureLevel)
}

// RequireFeatureLevel refuses, with FEATURE_LEVEL_UNSUPPORTED, an
// operation that needs level when the group is below it. A leader asks
// before it proposes a gated command (its state machine applied every
// raise committed before the proposal, and levels never go down); apply
// asks again, so that a command proposed past the gate changes nothing on
// any replica that knows it.
func (m *Machine) RequireFeatureLevel(level uint32, what string) *fault.Error {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.requireLevel(level, what)
}

// requireLevel is RequireFeatureLevel; callers hold m.mu.
func (m *Machine) requireLevel(level uint32, what string) *fault.Error {
	if have := effectiveLevel(m.featureLevel); have < level {
		return fault.Errorf(fault.ErrFeatureLevelUnsupported, "%s needs feature level %d; group %d is at %d (raise it with ursulactl cluster enable-feature once every node runs a release that knows it)",
			what, level, m.group, have)
	}
	return nil
}

// checkFeatureLevel returns the *FeatureLevelError of a command that would
// raise the group above what this build knows, before anything of it
// applies.
func (m *Machine) checkFeatureLevel(index uint64, cmd *storagev1.Command) error {
	if l := cmd.GetSetFeatureLevel().GetLevel(); l > MaxFeatureLevel {
		return &FeatureLevelError{Group: m.group, Level: l, Index: index}
	}
	return nil
}

// applySetFeatureLevel raises the group's level; the same level again is
// a duplicate, and a lower one (levels never go down) or 0 is refused.
func (m *Machine) applySetFeatureLevel(c *storagev1.SetFeatureLevel) *Result {
	l, have := c.GetLevel(), effectiveLevel(m.featureLevel)
	switch {
	case l == 0:
		return &Result{Err: fault.Errorf(fault.ErrInvalidArgument, "feature levels start at %d", BaselineFeatureLevel)}
	case l < have:
		return &Result{Err: fault.Errorf(fault.ErrFeatureLevelUnsupported, "group %d is at feature level %d: a feature level never goes down (to %d)", m.group, have, l)}
	case l == have:
		return &Result{Duplicate: true}
	}
	m.featureLevel = l
	return &Result{}
}

// FeatureProbes counts the test-only FeatureProbe commands the group
// applied (always 0 unless built with -tags featuretest).
func (m *Machine) FeatureProbes() uint64 {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.featureProbes
}
