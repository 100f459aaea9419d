package inproc

import (
	"context"
	"fmt"
	"reflect"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// frameHeaderLen is the gRPC message prefix on the wire (a compression flag
// and a 4-byte length) that grpc counts in WireLength.
const frameHeaderLen = 5

// multiHandler runs several stats handlers as one, in order, as grpc does
// with several grpc.StatsHandler options.
type multiHandler []stats.Handler

func combine(hs []stats.Handler) stats.Handler {
	switch len(hs) {
	case 0:
		return nil
	case 1:
		return hs[0]
	}
	return multiHandler(hs)
}

func (m multiHandler) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	for _, h := range m {
		ctx = h.TagRPC(ctx, info)
	}
	return ctx
}

func (m multiHandler) HandleRPC(ctx context.Context, s stats.RPCStats) {
	for _, h := range m {
		h.HandleRPC(ctx, s)
	}
}

func (m multiHandler) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	for _, h := range m {
		ctx = h.TagConn(ctx, info)
	}
	return ctx
}

func (m multiHandler) HandleConn(ctx context.Context, s stats.ConnStats) {
	for _, h := range m {
		h.HandleConn(ctx, s)
	}
}

// sizeOf is the marshalled size of a protobuf message, computed without
// marshalling, so that payload stats carry the numbers a network hop would;
// 0 for anything else.
func sizeOf(m any) int {
	if pm, ok := m.(proto.Message); ok {
		return proto.Size(pm)
	}
	return 0
}

// wireLen is the WireLength grpc reports for an uncompressed message of
// size bytes: the size plus the frame prefix, or 0 for a message of unknown
// size.
func wireLen(m any, size int) int {
	if _, ok := m.(proto.Message); ok {
		return size + frameHeaderLen
	}
	return 0
}

func outPayload(client bool, m any, size int) *stats.OutPayload {
	return &stats.OutPayload{
		Client:           client,
		Payload:          m,
		Length:           size,
		CompressedLength: size,
		WireLength:       wireLen(m, size),
		SentTime:         time.Now(),
	}
}

func inPayload(client bool, m any, size int) *stats.InPayload {
	return &stats.InPayload{
		Client:           client,
		Payload:          m,
		Length:           size,
		CompressedLength: size,
		WireLength:       wireLen(m, size),
		RecvTime:         time.Now(),
	}
}

// shallowCopy delivers a message: it copies the struct src points to into
// the one dst points to. A shallow copy of a protobuf message struct is
// sound here because the sender never touches the message again (the
// contract of this package); the two copies then share only what neither
// side modifies.
//
// A nil pointer of the right type delivers the zero message, as grpc
// marshals it to an empty one.
func shallowCopy(dst, src any) error {
	dv, sv := reflect.ValueOf(dst), reflect.ValueOf(src)
	if dv.Kind() != reflect.Pointer || dv.IsNil() || sv.Kind() != reflect.Pointer || dv.Type() != sv.Type() {
		return status.Errorf(codes.Internal, "inproc: cannot deliver a %T message into a %T", src, dst)
	}
	if sv.IsNil() {
		dv.Elem().SetZero()
		return nil
	}
	dv.Elem().Set(sv.Elem())
	return nil
}

// statusOf is the status a client of a grpc.Server sees for a handler's
// error: a status error as it is (a wrapped one with the wrapper's message),
// a context error as Canceled or DeadlineExceeded, anything else as Unknown
// with the error's text. nil for nil.
func statusOf(err error) *status.Status {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		return st
	}
	return status.FromContextError(err)
}

// errOf is st as the error a client receives: a new error built from the
// status, as a client decoding it off the wire gets, not the handler's error
// value, so that errors.Is behaves as it would across a network.
func errOf(st *status.Status) error {
	if st == nil {
		return nil
	}
	return st.Err()
}

// outgoingMD is the caller's outgoing metadata as a grpc.Server would hand it
// to the handler: a copy, keys lower-cased, without the headers the gRPC
// protocol reserves (grpc-go drops them on the client side). nil if there is
// none.
func outgoingMD(ctx context.Context) (metadata.MD, error) {
	md, ok := metadata.FromOutgoingContext(ctx)
	if !ok {
		return nil, nil
	}
	for k, vs := range md {
		if err := validatePair(k, vs); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		if reservedHeader(k) {
			delete(md, k)
		}
	}
	return md, nil
}

// reservedHeader mirrors grpc-go's list of headers the transport owns.
func reservedHeader(k string) bool {
	if k != "" && k[0] == ':' {
		return true
	}
	switch k {
	case "content-type", "user-agent", "grpc-message-type", "grpc-encoding",
		"grpc-message", "grpc-status", "grpc-timeout", "te":
		return true
	}
	return false
}

// validatePair mirrors grpc-go's check of outgoing metadata, which fails a
// call with codes.Internal before it starts.
func validatePair(k string, vs []string) error {
	if k == "" {
		return fmt.Errorf("there is an empty key in the header")
	}
	if k[0] == ':' {
		return nil
	}
	for i := 0; i < len(k); i++ {
		r := k[i]
		if !(r >= 'a' && r <= 'z') && !(r >= '0' && r <= '9') && r != '.' && r != '-' && r != '_' {
			return fmt.Errorf("header key %q contains illegal characters not in [0-9a-z-_.]", k)
		}
	}
	if strings.HasSuffix(k, "-bin") {
		return nil
	}
	for _, v := range vs {
		for i := 0; i < len(v); i++ {
			if v[i] < 0x20 || v[i] > 0x7e {
				return fmt.Errorf("header key %q contains value with non-printable ASCII characters", k)
			}
		}
	}
	return nil
}

// failFast is false when the caller asked grpc.WaitForReady(true); the
// stats handlers see it, nothing else does in-process.
func failFast(opts []grpc.CallOption) bool {
	ff := true
	for _, o := range opts {
		if o, ok := o.(grpc.FailFastCallOption); ok {
			ff = o.FailFast
		}
	}
	return ff
}

// finishCallOptions does, at the end of a call, what grpc does with the call
// options it can honour in-process: it fills grpc.Header (nil when no
// header was sent, as grpc), grpc.Trailer and grpc.Peer and runs
// grpc.OnFinish. Other call options (sizes, compression, credentials,
// codecs) mean nothing without a wire and are ignored.
func finishCallOptions(opts []grpc.CallOption, header metadata.MD, headerSent bool, trailer metadata.MD, p *peer.Peer, err error) {
	for _, o := range opts {
		switch o := o.(type) {
		case grpc.HeaderCallOption:
			if headerSent && header == nil {
				header = metadata.MD{}
			}
			*o.HeaderAddr = header
		case grpc.TrailerCallOption:
			*o.TrailerAddr = trailer
		case grpc.PeerCallOption:
			*o.PeerAddr = *p
		case grpc.OnFinishCallOption:
			o.OnFinish(err)
		}
	}
}

// copyMD copies metadata for a stats event, which must not see it change;
// empty metadata, the common case, costs nothing.
func copyMD(md metadata.MD) metadata.MD {
	if len(md) == 0 {
		return nil
	}
	return md.Copy()
}
