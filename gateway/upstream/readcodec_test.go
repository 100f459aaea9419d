package upstream

import (
	"bytes"
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// frames cuts b into buffers of at most n bytes, as the transport hands a
// message to the codec.
func frames(b []byte, n int) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		k := min(n, len(b))
		s = append(s, mem.SliceBuffer(bytes.Clone(b[:k])))
		b = b[k:]
	}
	return s
}

func TestReadCodecDecodesAsProto(t *testing.T) {
	c := readCodec{encoding.GetCodecV2("proto")}
	big := bytes.Repeat([]byte("0123456789abcdef"), 20<<10)
	cases := map[string]*streamv1.ReadResponse{
		"empty":   {},
		"no data": {NextOffset: "0000000000000000_0000000000000010", UpToDate: true, Incarnation: 7},
		"all fields": {Data: big, StartOffset: "a", NextOffset: "b", UpToDate: true, Closed: true,
			ContentType: "application/json", Incarnation: 3, TimedOut: true, RecordFirst: 4, RecordNext: 9},
	}
	for name, in := range cases {
		raw, err := proto.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		var got streamv1.ReadResponse
		if err := c.Unmarshal(frames(raw, 16<<10), &got); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !proto.Equal(&got, in) {
			t.Fatalf("%s: decoded %v, want %v", name, &got, in)
		}
	}

	// Proto's rules on odd encodings: the last data field wins (an empty
	// one clears it), and a data field of another wire type is unknown.
	raw := protowire.AppendTag(nil, readDataField, protowire.BytesType)
	raw = protowire.AppendBytes(raw, []byte("first"))
	raw = protowire.AppendTag(raw, 3, protowire.BytesType)
	raw = protowire.AppendString(raw, "next")
	raw = protowire.AppendTag(raw, readDataField, protowire.BytesType)
	raw = protowire.AppendBytes(raw, []byte("second"))
	for _, extra := range [][]byte{nil, protowire.AppendBytes(protowire.AppendTag(nil, readDataField, protowire.BytesType), nil),
		protowire.AppendVarint(protowire.AppendTag(nil, readDataField, protowire.VarintType), 5)} {
		enc := append(bytes.Clone(raw), extra...)
		var want, got streamv1.ReadResponse
		if err := proto.Unmarshal(enc, &want); err != nil {
			t.Fatal(err)
		}
		if err := c.Unmarshal(frames(enc, 5), &got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&got, &want) || !bytes.Equal(got.GetData(), want.GetData()) {
			t.Fatalf("decoded %v, proto.Unmarshal %v", &got, &want)
		}
	}

	// Truncated input is refused, as by proto.Unmarshal.
	full, _ := proto.Marshal(cases["all fields"])
	var got streamv1.ReadResponse
	if err := c.Unmarshal(frames(full[:len(full)-10], 1<<10), &got); err == nil {
		t.Fatal("a truncated ReadResponse decoded")
	}
}

func TestReadCodecLeavesOtherMessagesToProto(t *testing.T) {
	c := readCodec{encoding.GetCodecV2("proto")}
	in := &streamv1.ReadRequest{Ref: &streamv1.StreamRef{Bucket: "b", Stream: "s"}, Offset: "x"}
	raw, _ := proto.Marshal(in)
	var got streamv1.ReadRequest
	if err := c.Unmarshal(frames(raw, 3), &got); err != nil || !proto.Equal(&got, in) {
		t.Fatalf("decoded %v (%v), want %v", &got, err, in)
	}
	if c.Name() != "proto" {
		t.Fatalf("codec name %q: the call's content-subtype would change", c.Name())
	}
}
