package backupfmt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// Snapshots of real machines in varied states, and corruptions of them,
// are checked in storage/stream (TestValidateSnapshotOfRealMachines,
// TestValidateSnapshotRefusesCorruption), which can build them; these
// cases are the smallest ones.

func TestValidateSnapshotSmall(t *testing.T) {
	stream := func() *storagev1.StreamState {
		return &storagev1.StreamState{Bucket: "b", Stream: "s", Incarnation: 3, Json: true, ContentType: "application/json",
			Data: []byte("1\n2\n"), Records: []uint64{4}, RecordNext: 2}
	}
	for _, tc := range []struct {
		name string
		snap *storagev1.Snapshot
		want string // "" passes
	}{
		{"nil", nil, "no snapshot"},
		{"an empty group", &storagev1.Snapshot{Format: SnapshotFormat}, ""},
		{"format 1", &storagev1.Snapshot{Format: 1}, "format"},
		{"one JSON stream", &storagev1.Snapshot{Format: SnapshotFormat, AppliedIndex: 3, Streams: []*storagev1.StreamState{stream()}}, ""},
		{"an incarnation above the applied index", &storagev1.Snapshot{Format: SnapshotFormat, AppliedIndex: 2, Streams: []*storagev1.StreamState{stream()}}, "outside"},
		{"an incarnation within the offset", &storagev1.Snapshot{Format: SnapshotFormat, AppliedIndex: 2, IncarnationOffset: 1, Streams: []*storagev1.StreamState{stream()}}, ""},
		{"an offset that would wrap", &storagev1.Snapshot{Format: SnapshotFormat, AppliedIndex: 2, IncarnationOffset: ^uint64(0), Streams: []*storagev1.StreamState{stream()}}, ""},
		{"a record count off by one", &storagev1.Snapshot{Format: SnapshotFormat, AppliedIndex: 3, Streams: []*storagev1.StreamState{func() *storagev1.StreamState {
			s := stream()
			s.RecordNext = 3
			return s
		}()}}, "record"},
		{"a hot window that overflows", &storagev1.Snapshot{Format: SnapshotFormat, AppliedIndex: 3, Streams: []*storagev1.StreamState{func() *storagev1.StreamState {
			s := stream()
			s.ColdEnd, s.Json, s.Records, s.RecordNext = ^uint64(0)-1, false, nil, 0
			return s
		}()}}, "beyond"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateSnapshot(tc.snap)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want one about %q", err, tc.want)
			}
		})
	}
}

func TestDecodeGroup(t *testing.T) {
	snap, _ := proto.Marshal(&storagev1.Snapshot{Format: SnapshotFormat})
	bad, _ := proto.Marshal(&storagev1.Snapshot{Format: SnapshotFormat, Buckets: []string{"z", "a"}})
	enc := func(g *backupv1.GroupObject) []byte {
		b, err := EncodeGroup(g)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := &backupv1.GroupObject{FormatVersion: FormatVersion, ClusterId: "c", Group: 1, GroupCount: 4, Snapshot: snap}
	if g, s, err := DecodeGroup(enc(good)); err != nil || g.GetGroup() != 1 || s.GetFormat() != SnapshotFormat {
		t.Fatalf("DecodeGroup = %v, %v, %v", g, s, err)
	}
	for name, tc := range map[string]struct {
		b    []byte
		want error
	}{
		"another version":      {enc(&backupv1.GroupObject{FormatVersion: FormatVersion + 1, GroupCount: 4, Snapshot: snap}), ErrVersion},
		"not a group object":   {[]byte{0xff, 0xff}, ErrCorrupt},
		"a group out of range": {enc(&backupv1.GroupObject{FormatVersion: FormatVersion, Group: 4, GroupCount: 4, Snapshot: snap}), ErrCorrupt},
		"an invalid snapshot":  {enc(&backupv1.GroupObject{FormatVersion: FormatVersion, GroupCount: 4, Snapshot: bad}), ErrCorrupt},
	} {
		if _, _, err := DecodeGroup(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	if d := Digest([]byte("x")); !ValidDigest(d) || ValidDigest(strings.ToUpper(d)) || ValidDigest(d[1:]) {
		t.Fatal("ValidDigest disagrees with Digest")
	}
}

// TestWalkSkipsPages: a reader answering ErrSkipPage leaves out what the
// page indexes and the walk goes on; another error stops it.
func TestWalkSkipsPages(t *testing.T) {
	snap := &storagev1.Snapshot{Streams: []*storagev1.StreamState{
		{ColdIndex: []*storagev1.ColdLevel{{Entries: []*storagev1.ColdRef{{Key: "c1"}}}, {Entries: []*storagev1.ColdRef{{Key: "p1", Kind: storagev1.ColdKind_COLD_KIND_PAGE}}}}},
		{HotExternal: []*storagev1.HotExternal{{Ref: &storagev1.ColdRef{Key: "x1"}}}},
	}}
	var keys []string
	err := Walk(t.Context(), snap, func(context.Context, *storagev1.ColdRef) ([]byte, error) {
		return nil, fmt.Errorf("gone: %w", ErrSkipPage)
	}, func(r Ref) error {
		keys = append(keys, r.Key)
		return nil
	})
	if err != nil || strings.Join(keys, ",") != "c1,p1,x1" {
		t.Fatalf("Walk = %v, %v", keys, err)
	}
	if err := Walk(t.Context(), snap, func(context.Context, *storagev1.ColdRef) ([]byte, error) {
		return nil, errors.New("boom")
	}, func(Ref) error { return nil }); err == nil {
		t.Fatal("a failed page read must stop the walk")
	}
}
