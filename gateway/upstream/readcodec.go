package upstream

import (
	"fmt"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// readCodec is the proto codec with one difference: a ReadResponse's data
// is not copied out of the received message but kept where it arrived.
// grpc-go's codec gathers a message's frames into a pooled buffer, then
// proto.Unmarshal copies the bytes field out of it; for a replay read the
// data is nearly the whole message (hundreds of KiB), so the gateway copied
// every byte it relayed twice. Here the frames are gathered into a buffer
// the response owns, and Data is a slice of it.
type readCodec struct{ encoding.CodecV2 }

// readCodecOption makes a call use readCodec. Its name is "proto", so the
// call's content-subtype, and the node's codec, are unchanged.
var readCodecOption = grpc.ForceCodecV2(readCodec{encoding.GetCodecV2("proto")})

// readCodecOptions is the call options of a read that passes none.
var readCodecOptions = []grpc.CallOption{readCodecOption}

// readDataField is ReadResponse.data's field number.
var readDataField = protowire.Number((&streamv1.ReadResponse{}).ProtoReflect().Descriptor().Fields().ByName("data").Number())

func (c readCodec) Unmarshal(data mem.BufferSlice, v any) error {
	resp, ok := v.(*streamv1.ReadResponse)
	if !ok {
		return c.CodecV2.Unmarshal(data, v)
	}
	buf := data.Materialize() // a copy of its own; grpc frees data after
	payload, rest, err := splitReadData(buf)
	if err != nil {
		return err
	}
	if err := proto.Unmarshal(rest, resp); err != nil {
		return err
	}
	if payload != nil {
		resp.Data = payload
	}
	return nil
}

// splitReadData finds the data field of an encoded ReadResponse: the last
// occurrence's bytes (proto's rule for a repeated scalar field) as a slice
// of b, and every other field, re-encoded in order, for proto.Unmarshal. A
// data field of the wrong wire type stays in rest, where proto.Unmarshal
// treats it as it would in any message.
func splitReadData(b []byte) (payload, rest []byte, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, fmt.Errorf("decode ReadResponse: %w", protowire.ParseError(n))
		}
		if num == readDataField && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b[n:])
			if m < 0 {
				return nil, nil, fmt.Errorf("decode ReadResponse: %w", protowire.ParseError(m))
			}
			payload = v[:len(v):len(v)]
			b = b[n+m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, nil, fmt.Errorf("decode ReadResponse: %w", protowire.ParseError(m))
		}
		rest = append(rest, b[:n+m]...)
		b = b[n+m:]
	}
	if payload != nil && len(payload) == 0 {
		payload = nil // as proto.Unmarshal leaves an empty bytes field
	}
	return payload, rest, nil
}
