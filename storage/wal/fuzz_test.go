package wal

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	pb "go.etcd.io/raft/v3/raftpb"
)

// FuzzDecodeFrame checks that decoding arbitrary bytes as journal frames and
// records never panics, and that a decoded record re-encodes to a frame that
// decodes again.
func FuzzDecodeFrame(f *testing.F) {
	cs := &pb.ConfState{Voters: []uint64{1, 2}, Learners: []uint64{3}}
	f.Add(appendFrame(nil, RecordEntries, func(b []byte) []byte { return appendEntries(b, 7, ents(2, 5, 7)) }))
	f.Add(appendFrame(nil, RecordHardState, func(b []byte) []byte { return appendHardState(putU32(b, 1), hs(3, 1, 2)) }))
	f.Add(appendFrame(nil, RecordSnapshot, func(b []byte) []byte {
		b = putU64(append(putU32(b, 1), 1), 9)
		return appendConfState(putU64(b, 2), cs)
	}))
	f.Add([]byte{})
	f.Add(make([]byte, 9))
	f.Fuzz(func(t *testing.T, b []byte) {
		for len(b) > 0 {
			typ, payload, n, err := DecodeFrame(b)
			if err != nil {
				if n > len(b) {
					t.Fatalf("frame size %d beyond input %d", n, len(b))
				}
				return
			}
			if n <= 0 || n > len(b) {
				t.Fatalf("bad frame size %d for input %d", n, len(b))
			}
			rec, err := DecodeRecord(typ, payload)
			if err == nil && rec.Type == RecordEntries {
				re := appendFrame(nil, RecordEntries, func(x []byte) []byte { return appendEntries(x, rec.Group, rec.Entries) })
				if _, p2, _, err := DecodeFrame(re); err != nil || string(p2) != string(payload) {
					t.Fatalf("entries record does not round-trip: %v", err)
				}
			}
			b = b[n:]
		}
	})
}

// FuzzDecodeRecord checks that decoding arbitrary record payloads never
// panics (the frame CRC keeps FuzzDecodeFrame from reaching deep into them).
func FuzzDecodeRecord(f *testing.F) {
	for _, s := range seedFrames() {
		typ, payload, _, err := DecodeFrame(s)
		if err == nil {
			f.Add(typ, payload)
		}
	}
	f.Fuzz(func(t *testing.T, typ byte, payload []byte) {
		rec, err := DecodeRecord(typ, payload)
		if err != nil {
			return
		}
		if rec.Type == RecordEntries {
			for i := 1; i < len(rec.Entries); i++ {
				if rec.Entries[i].GetIndex() != rec.Entries[i-1].GetIndex()+1 {
					t.Fatalf("non-consecutive entries accepted")
				}
			}
		}
	})
}

// seedFrames are valid frames of every record type.
func seedFrames() [][]byte {
	cs := &pb.ConfState{Voters: []uint64{1, 2}, Learners: []uint64{3}}
	j := &Journal{shard: 0, meta: map[uint32]*groupMeta{
		0: {hs: hardStateOf(hs(2, 1, 5)), snap: SnapshotMarker{Index: 3, Term: 1, ConfState: cs}},
		4: {hs: hardStateOf(hs(1, 0, 0))},
	}}
	return [][]byte{
		j.appendCheckpoint(nil, 1),
		appendFrame(nil, RecordEntries, func(b []byte) []byte { return appendEntries(b, 7, ents(2, 5, 7)) }),
		appendFrame(nil, RecordHardState, func(b []byte) []byte { return appendHardState(putU32(b, 1), hs(3, 1, 2)) }),
		appendFrame(nil, RecordSnapshot, func(b []byte) []byte {
			b = putU64(append(putU32(b, 1), 1), 9)
			return appendConfState(putU64(b, 2), cs)
		}),
	}
}

// TestWriteFuzzSeeds regenerates testdata/fuzz seeds when
// WAL_WRITE_FUZZ_SEEDS=1.
func TestWriteFuzzSeeds(t *testing.T) {
	if os.Getenv("WAL_WRITE_FUZZ_SEEDS") == "" {
		t.Skip("set WAL_WRITE_FUZZ_SEEDS=1 to regenerate")
	}
	frames := seedFrames()
	all := bytes.Join(frames, nil)
	seeds := map[string][]byte{
		"checkpoint": frames[0], "entries": frames[1], "hardstate": frames[2], "snapshot": frames[3],
		"stream": all, "torn": all[:len(all)-4],
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzDecodeFrame")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range seeds {
		body := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	dir = filepath.Join("testdata", "fuzz", "FuzzDecodeRecord")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for i, fr := range frames {
		typ, payload, _, _ := DecodeFrame(fr)
		body := fmt.Sprintf("go test fuzz v1\nbyte(%q)\n[]byte(%q)\n", typ, payload)
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("type%d", i+1)), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
