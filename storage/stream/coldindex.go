package stream

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// coldIndex is a stream's cold index (StreamState.cold_index) held in its
// wire encoding rather than decoded. Decoded, one flushed chunk is six
// objects full of pointers (the levels, their entries, the reference and
// its key); a node with a million streams written now and then holds one
// or two such chunks per stream, and they were most of what the collector
// marked there and a third of the heap. Encoded, it is one pointer-free
// slice the collector does not scan, and about a third of the size.
//
// Readers decode a fresh copy (coldLevels), which they may change; apply
// stores the result back (setColdLevels). The stream's meta never holds
// the index: snapshots append the encoding to it (streamEncoding.add).
type coldIndex struct {
	// enc is the encoding of StreamState{ColdIndex: levels}: the
	// cold_index fields alone; nil for an empty index.
	enc []byte
	// level0 counts the entries of level 0, for the compaction scan,
	// which looks at every stream of a group.
	level0 int
}

// coldLevels decodes the stream's cold index, level 0 first.
func (s *stream) coldLevels() []*storagev1.ColdLevel {
	if len(s.cold.enc) == 0 {
		return nil
	}
	var st storagev1.StreamState
	if err := proto.Unmarshal(s.cold.enc, &st); err != nil {
		// Only setColdLevels writes enc: memory itself is corrupt.
		panic(fmt.Sprintf("stream %s: the cold index held in memory does not decode: %v", s.meta.GetStream(), err))
	}
	return st.ColdIndex
}

// setColdLevels replaces the stream's cold index.
func (s *stream) setColdLevels(levels []*storagev1.ColdLevel) {
	s.cold = coldIndex{}
	if len(levels) == 0 {
		return
	}
	enc, err := snapshotMarshal.Marshal(&storagev1.StreamState{ColdIndex: levels})
	if err != nil {
		panic(fmt.Sprintf("stream %s: encode the cold index: %v", s.meta.GetStream(), err))
	}
	s.cold = coldIndex{enc: enc, level0: len(levels[0].GetEntries())}
}
