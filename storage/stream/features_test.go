package stream

import (
	"bytes"
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/fault"
)

func setLevel(l uint32) *storagev1.Command {
	return &storagev1.Command{Op: &storagev1.Command_SetFeatureLevel{SetFeatureLevel: &storagev1.SetFeatureLevel{Level: l}}}
}

func probeCmd() *storagev1.Command {
	return &storagev1.Command{Op: &storagev1.Command_FeatureProbe{FeatureProbe: &storagev1.FeatureProbe{Note: "t"}}}
}

// applyErr applies cmd at the next index and returns Apply's error (nil
// when it applied, refused or not).
func (a *applier) applyErr(cmd *storagev1.Command) error {
	a.t.Helper()
	data, err := proto.Marshal(cmd)
	if err != nil {
		a.t.Fatal(err)
	}
	a.index++
	_, err = a.m.Apply(a.index, data)
	return err
}

// TestSetFeatureLevel: the level starts at the baseline, is raised, a
// repeat is a duplicate, and it never goes down; 0 is refused. A refusal
// changes nothing.
func TestSetFeatureLevel(t *testing.T) {
	if MaxFeatureLevel < 2 {
		// A release at level 1 can only take its own level: the raise path
		// runs in the featuretest build (make test runs it through the e2e
		// test) and below with a forged level of 1.
		a := newApplier(t)
		if got := a.m.FeatureLevel(); got != BaselineFeatureLevel {
			t.Fatalf("new group at level %d, want %d", got, BaselineFeatureLevel)
		}
		if r := a.applyCmd(1, setLevel(1)); r.Err != nil || !r.Duplicate {
			t.Fatalf("raise to the baseline: %+v, want a duplicate", r)
		}
		if r := a.applyCmd(1, setLevel(0)); code(r) != fault.ErrInvalidArgument {
			t.Fatalf("level 0: %v, want INVALID_ARGUMENT", r.Err)
		}
		return
	}
	tests := []struct {
		name    string
		level   uint32
		want    *fault.Kind
		dup     bool
		levelAt uint32
	}{
		{"baseline again", BaselineFeatureLevel, nil, true, BaselineFeatureLevel},
		{"zero", 0, fault.ErrInvalidArgument, false, BaselineFeatureLevel},
		{"raise", 2, nil, false, 2},
		{"repeat", 2, nil, true, 2},
		{"down", 1, fault.ErrFeatureLevelUnsupported, false, 2},
	}
	a := newApplier(t)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := stateOf(t, a.m)
			r := a.applyCmd(1, setLevel(tc.level))
			if code(r) != tc.want || r.Duplicate != tc.dup {
				t.Fatalf("level %d: err %v duplicate %v, want %v %v", tc.level, r.Err, r.Duplicate, tc.want, tc.dup)
			}
			if got := a.m.FeatureLevel(); got != tc.levelAt {
				t.Fatalf("level after: %d, want %d", got, tc.levelAt)
			}
			if tc.want != nil && !proto.Equal(before, stateOf(t, a.m)) {
				t.Fatal("a refused level changed the state")
			}
		})
	}
}

// TestUnknownFeatureLevelHaltsTheGroup: a level above what this build
// knows, in an entry or a snapshot, is a *FeatureLevelError that asks to
// halt the group (not ErrUnknownCommand, which stops the node) and names
// the level; nothing of it applies, not even the applied index.
func TestUnknownFeatureLevelHaltsTheGroup(t *testing.T) {
	a := newApplier(t)
	a.do(1, &storagev1.CreateBucket{Bucket: "b"})
	before, applied := stateOf(t, a.m), a.m.Applied()
	err := a.applyErr(setLevel(MaxFeatureLevel + 1))
	var fe *FeatureLevelError
	if !errors.As(err, &fe) || !errors.Is(err, ErrFeatureLevelUnsupported) || errors.Is(err, ErrUnknownCommand) || !fe.HaltGroup() {
		t.Fatalf("Apply of level %d = %v, want a halting *FeatureLevelError", MaxFeatureLevel+1, err)
	}
	if fe.Level != MaxFeatureLevel+1 || fe.Index != a.index {
		t.Fatalf("error names level %d at %d, want %d at %d", fe.Level, fe.Index, MaxFeatureLevel+1, a.index)
	}
	if !proto.Equal(before, stateOf(t, a.m)) || a.m.Applied() != applied {
		t.Fatal("an unknown level changed the state or the applied index")
	}

	// A snapshot of a group at such a level is refused the same way.
	raw, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	snap := decodeSnap(t, raw)
	snap.FeatureLevel = MaxFeatureLevel + 1
	raised, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMachine(0)
	if err := m.Restore(raised); !errors.As(err, &fe) || fe.Index != 0 || !fe.HaltGroup() {
		t.Fatalf("Restore of a level-%d snapshot = %v, want a halting *FeatureLevelError", MaxFeatureLevel+1, err)
	}
	if m.HasBucket("b") {
		t.Fatal("a refused snapshot was restored")
	}
}

// TestFeatureLevelInSnapshots: a group never raised encodes no level (its
// snapshot is the one a release before levels wrote); a raised level
// survives a snapshot and its restore.
func TestFeatureLevelInSnapshots(t *testing.T) {
	a := newApplier(t)
	a.do(1, &storagev1.CreateBucket{Bucket: "b"})
	if s := snapOf(t, a.m); s.FeatureLevel != 0 || s.FeatureProbes != 0 {
		t.Fatalf("baseline snapshot holds level %d, probes %d; want neither", s.FeatureLevel, s.FeatureProbes)
	}
	a.applyCmd(1, setLevel(BaselineFeatureLevel))
	if s := snapOf(t, a.m); s.FeatureLevel != 0 {
		t.Fatalf("a raise to the baseline is encoded (%d)", s.FeatureLevel)
	}
	// Forge a raised snapshot of a level this build knows.
	raw, err := a.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	snap := decodeSnap(t, raw)
	snap.FeatureLevel = MaxFeatureLevel
	enc, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	m := NewMachine(0)
	if err := m.Restore(enc); err != nil {
		t.Fatal(err)
	}
	if got := m.FeatureLevel(); got != MaxFeatureLevel {
		t.Fatalf("restored level %d, want %d", got, MaxFeatureLevel)
	}
	again, err := m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	if MaxFeatureLevel > BaselineFeatureLevel && !bytes.Equal(again, enc) {
		t.Fatal("a restored level does not encode back to the same snapshot")
	}
}

// TestImportKeepsTheFeatureLevel: an import never raises the group: a
// snapshot above the group's level is refused (FEATURE_LEVEL_UNSUPPORTED,
// nothing changed); the group's own level stays.
func TestImportKeepsTheFeatureLevel(t *testing.T) {
	src := newApplier(t)
	src.do(1, &storagev1.CreateBucket{Bucket: "b"})
	raw, err := src.m.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	snap := decodeSnap(t, raw)
	snap.FeatureLevel = BaselineFeatureLevel + 1
	above, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		t.Fatal(err)
	}
	dst := newApplier(t)
	before := stateOf(t, dst.m)
	r := dst.applyCmd(2, &storagev1.Command{Op: &storagev1.Command_ImportGroup{ImportGroup: importOp(above)}})
	if code(r) != fault.ErrFeatureLevelUnsupported {
		t.Fatalf("import of a level-%d snapshot into a baseline group: %v, want FEATURE_LEVEL_UNSUPPORTED", snap.FeatureLevel, r.Err)
	}
	if !proto.Equal(before, stateOf(t, dst.m)) {
		t.Fatal("a refused import changed the state")
	}
	dst.do(3, importOp(raw))
	if got := dst.m.FeatureLevel(); got != BaselineFeatureLevel || snapOf(t, dst.m).FeatureLevel != 0 {
		t.Fatalf("level %d after a baseline import, want %d stored as 0", got, BaselineFeatureLevel)
	}
}

// TestFeatureProbeIsGated: the test-only FeatureProbe is a command a
// release build does not know (ErrUnknownCommand: the node stops, as for
// any newer release's command); the featuretest build applies it only at
// its level.
func TestFeatureProbeIsGated(t *testing.T) {
	a := newApplier(t)
	if testFeatureLevels == 0 {
		if err := a.applyErr(probeCmd()); !errors.Is(err, ErrUnknownCommand) {
			t.Fatalf("a probe in a release build = %v, want ErrUnknownCommand", err)
		}
		return
	}
	if r := a.applyCmd(1, probeCmd()); code(r) != fault.ErrFeatureLevelUnsupported || a.m.FeatureProbes() != 0 {
		t.Fatalf("a probe below its level: %v (probes %d), want FEATURE_LEVEL_UNSUPPORTED and none", r.Err, a.m.FeatureProbes())
	}
	if err := a.m.RequireFeatureLevel(MaxFeatureLevel, "a probe"); fault.KindOf(err) != fault.ErrFeatureLevelUnsupported {
		t.Fatalf("the gate below the level = %v", err)
	}
	a.applyCmd(1, setLevel(MaxFeatureLevel))
	if err := a.m.RequireFeatureLevel(MaxFeatureLevel, "a probe"); err != nil {
		t.Fatalf("the gate at the level = %v", err)
	}
	if r := a.applyCmd(1, probeCmd()); r.Err != nil || a.m.FeatureProbes() != 1 {
		t.Fatalf("a probe at its level: %v (probes %d)", r.Err, a.m.FeatureProbes())
	}
	if got := snapOf(t, a.m).FeatureProbes; got != 1 {
		t.Fatalf("snapshot holds %d probes, want 1", got)
	}
}
