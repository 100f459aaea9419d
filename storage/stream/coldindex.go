package stream

import (
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
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

// Field numbers find walks, from the generated descriptors.
var (
	coldIndexField = (&storagev1.StreamState{}).ProtoReflect().Descriptor().Fields().ByName("cold_index").Number()
	levelEntries   = (&storagev1.ColdLevel{}).ProtoReflect().Descriptor().Fields().ByName("entries").Number()
	refStart       = (&storagev1.ColdRef{}).ProtoReflect().Descriptor().Fields().ByName("start").Number()
	refEnd         = (&storagev1.ColdRef{}).ProtoReflect().Descriptor().Fields().ByName("end").Number()
)

// find returns the index entry covering pos, as coldfmt.FindRef over each
// level, level 0 first, would: reads ask at every cold read, so it walks
// the encoding and decodes only the entry it returns.
func (c *coldIndex) find(pos uint64) *storagev1.ColdRef {
	for b := c.enc; len(b) > 0; {
		level, rest, isLevel := nextField(b, coldIndexField)
		b = rest
		if !isLevel {
			continue
		}
		for len(level) > 0 {
			ref, more, isRef := nextField(level, levelEntries)
			level = more
			if !isRef {
				continue
			}
			start, end := refRange(ref)
			if end <= pos {
				continue
			}
			if start > pos {
				break // entries are in position order: none covers pos here
			}
			var out storagev1.ColdRef
			if err := proto.Unmarshal(ref, &out); err != nil {
				corruptIndex(err)
			}
			return &out
		}
	}
	return nil
}

// nextField consumes one field of a message's encoding; when it is the
// length-delimited field num, it returns its bytes and true.
func nextField(b []byte, num protowire.Number) (value, rest []byte, ok bool) {
	n, typ, l := protowire.ConsumeTag(b)
	if l < 0 {
		corruptIndex(protowire.ParseError(l))
	}
	b = b[l:]
	if n == num && typ == protowire.BytesType {
		v, l := protowire.ConsumeBytes(b)
		if l < 0 {
			corruptIndex(protowire.ParseError(l))
		}
		return v, b[l:], true
	}
	l = protowire.ConsumeFieldValue(n, typ, b)
	if l < 0 {
		corruptIndex(protowire.ParseError(l))
	}
	return nil, b[l:], false
}

// refRange reads a ColdRef encoding's start and end.
func refRange(ref []byte) (start, end uint64) {
	for len(ref) > 0 {
		n, typ, l := protowire.ConsumeTag(ref)
		if l < 0 {
			corruptIndex(protowire.ParseError(l))
		}
		ref = ref[l:]
		if typ == protowire.VarintType && (n == refStart || n == refEnd) {
			v, l := protowire.ConsumeVarint(ref)
			if l < 0 {
				corruptIndex(protowire.ParseError(l))
			}
			if n == refStart {
				start = v
			} else {
				end = v
			}
			ref = ref[l:]
			continue
		}
		l = protowire.ConsumeFieldValue(n, typ, ref)
		if l < 0 {
			corruptIndex(protowire.ParseError(l))
		}
		ref = ref[l:]
	}
	return start, end
}

// corruptIndex stops the process: only setColdLevels writes an index's
// encoding, so one that does not decode means memory itself is corrupt.
func corruptIndex(err error) {
	panic(fmt.Sprintf("stream: a cold index held in memory does not decode: %v", err))
}
