package gateway

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
)

// FuzzParseOffset: no panic; accepted offsets are exactly the protocol's
// forms and never contain URL-unsafe characters.
func FuzzParseOffset(f *testing.F) {
	for _, s := range []string{"-1", "now", "0000000000000000_0000000000000000", "", "0,1", "0 1", "../x", "1_2\x00", "9999999999999999_9999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseOffset(s)
		if err != nil {
			if !errors.Is(err, ErrBadOffset) {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if got != s {
			t.Fatalf("ParseOffset(%q) = %q", s, got)
		}
		if s != "-1" && s != "now" && strings.Trim(s, "0123456789_") != "" {
			t.Fatalf("accepted %q", s)
		}
		if strings.ContainsAny(s, ",&=?/ \r\n\x00") {
			t.Fatalf("accepted unsafe offset %q", s)
		}
	})
}

// FuzzReadParams: no panic on any raw query; every error is one of ours.
func FuzzReadParams(f *testing.F) {
	for _, s := range []string{"", "offset=-1", "offset=", "offset=a&offset=b", "live=sse", "offset=now&live=long-poll&cursor=99", "%zz", "offset=1_1;x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		p, err := parseReadParams(raw)
		if err != nil {
			return
		}
		if _, err := ParseOffset(p.offset); err != nil {
			t.Fatalf("accepted bad offset %q from %q", p.offset, raw)
		}
	})
}

// FuzzCreateHeaders: no panic; values that parse satisfy the protocol's
// grammar.
func FuzzCreateHeaders(f *testing.F) {
	f.Add("3600", "", "true", "", "", "", true, false, true, false, false, false)
	f.Add("", "2030-01-01T00:00:00.123Z", "", "/v1/stream/src", "0000000000000000_0000000000000000", "2", false, true, false, true, true, true)
	f.Add("00060", "2030-01-01", "TRUE", "", "now", "05", true, true, true, false, true, true)
	f.Add("+1", "x", "yes", "", "", "0", true, false, true, false, false, true)
	f.Fuzz(func(t *testing.T, ttl, exp, closed, from, off, sub string, hasTTL, hasExp, hasClosed, hasFrom, hasOff, hasSub bool) {
		h := http.Header{}
		set := func(ok bool, k, v string) {
			if ok {
				h[k] = []string{v}
			}
		}
		set(hasTTL, hStreamTTL, ttl)
		set(hasExp, hStreamExpiresAt, exp)
		set(hasClosed, hStreamClosed, closed)
		set(hasFrom, hStreamForkedFrom, from)
		set(hasOff, hStreamForkOffset, off)
		set(hasSub, hStreamForkSubOffset, sub)
		c, err := ParseCreate(h)
		if err != nil {
			return
		}
		if hasTTL && hasExp {
			t.Fatal("accepted TTL together with Expires-At")
		}
		if (hasOff || hasSub) && !hasFrom {
			t.Fatal("accepted fork headers without Stream-Forked-From")
		}
		if hasTTL && (ttl == "" || (len(ttl) > 1 && ttl[0] == '0') || !isDigits(ttl)) {
			t.Fatalf("accepted TTL %q", ttl)
		}
		if c.Closed != (hasClosed && strings.EqualFold(strings.TrimSpace(closed), "true")) {
			t.Fatalf("closed = %v for %q", c.Closed, closed)
		}
		if hasOff && !isOffsetToken(off) {
			t.Fatalf("accepted fork offset %q", off)
		}
	})
}

// FuzzProducerHeaders: no panic; accepted numbers are within 2^53-1.
func FuzzProducerHeaders(f *testing.F) {
	f.Add("p", "0", "0", true, true, true)
	f.Add("", "0", "0", true, true, true)
	f.Add("p", "9007199254740992", "1", true, true, true)
	f.Add("p", "1e3", "-1", true, true, false)
	f.Fuzz(func(t *testing.T, id, epoch, seq string, hasID, hasEpoch, hasSeq bool) {
		h := http.Header{}
		if hasID {
			h[hProducerID] = []string{id}
		}
		if hasEpoch {
			h[hProducerEpoch] = []string{epoch}
		}
		if hasSeq {
			h[hProducerSeq] = []string{seq}
		}
		p, ok, err := ParseProducer(h)
		if err != nil {
			if ok {
				t.Fatal("ok with error")
			}
			return
		}
		if ok != (hasID || hasEpoch || hasSeq) {
			t.Fatalf("present = %v", ok)
		}
		if ok && (p.Epoch > maxSafeInteger || p.Seq > maxSafeInteger || !isDigits(epoch) || !isDigits(seq) || strings.TrimSpace(id) == "") {
			t.Fatalf("accepted %+v from %q %q %q", p, id, epoch, seq)
		}
	})
}

// FuzzSSEData: framing never lets payload bytes start a new event or field.
func FuzzSSEData(f *testing.F) {
	f.Add([]byte("safe\r\n\r\nevent: control\r\ndata: {}\r\n\r\nmore"))
	f.Add([]byte("a\rb\nc"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, payload []byte) {
		out := string(appendSSEData(nil, payload))
		if !strings.HasPrefix(out, "event: data\n") || !strings.HasSuffix(out, "\n\n") {
			t.Fatalf("bad framing %q", out)
		}
		body := strings.TrimSuffix(strings.TrimPrefix(out, "event: data\n"), "\n")
		if strings.Contains(body, "\r") {
			t.Fatalf("CR in framed output %q", out)
		}
		for _, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
			if !strings.HasPrefix(line, "data:") {
				t.Fatalf("line %q is not a data line in %q", line, out)
			}
		}
	})
}

// FuzzHandler: no request makes the handler panic, every response
// carries the security headers, and no header value makes it answer 500:
// the node is reached through a client that marshals every request as
// gRPC does (a string field that is not valid UTF-8 fails there, which
// used to come back as 500 for Producer-Id, Content-Type and Stream-Seq),
// so whatever the gateway passes on must be well-formed. A header named
// Producer-Id comes with valid Producer-Epoch and Producer-Seq, so that
// its value reaches the producer checks. The seeds (below and in
// testdata/fuzz/FuzzHandler) run with plain go test.
func FuzzHandler(f *testing.F) {
	f.Add("PUT", "/v1/stream/a", "Stream-TTL", "1e3", "x")
	f.Add("POST", "/v1/stream/a", "Producer-Epoch", "1", "")
	f.Add("GET", "/v1/stream/a?offset=&live=sse", "", "", "")
	f.Add("OPTIONS", "/anything", "Access-Control-Request-Headers", "a,,b", "")
	f.Add("PUT", "/b%00/x", "", "", "")
	f.Add("POST", "/v1/stream/a", "Producer-Id", "\xff\xfe", "x")
	f.Add("POST", "/v1/stream/a", "Producer-Id", strings.Repeat("p", 257), "x")
	f.Add("POST", "/v1/stream/a", "Content-Type", "text/\x01plain", "x")
	f.Add("POST", "/v1/stream/a", "Stream-Seq", "\xed\xa0\x80", "x")
	f.Add("POST", "/v1/stream/a", "Stream-Seq", strings.Repeat("9", 300), "x")
	f.Add("PUT", "/v1/stream/a", "Content-Type", "a\xc3", "")
	f.Add("POST", "/b1/s/append-batch", "Producer-Id", "p\x85", "\x00\x00\x00\x01x")
	f.Add("PUT", "/b1/s/snapshot/0000000000000000_0000000000000000", "Content-Type", "\xc0\xaf", "x")
	f.Fuzz(func(t *testing.T, method, target, hk, hv, body string) {
		if !isToken(method) || !strings.HasPrefix(target, "/") {
			return
		}
		req, err := http.NewRequest(method, "http://example.com"+target, strings.NewReader(body))
		if err != nil {
			return
		}
		if isToken(hk) {
			key := http.CanonicalHeaderKey(hk)
			if key == hProducerID {
				req.Header[hProducerEpoch] = []string{"0"}
				req.Header[hProducerSeq] = []string{"0"}
			}
			req.Header[key] = []string{hv}
		}
		g := newTestGateway(t, &fakeClient{}, nil)
		g.client = marshalingClient{}
		rec := httptest.NewRecorder()
		g.Handler().ServeHTTP(rec, req)
		if rec.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Fatalf("%s %s: no nosniff", method, target)
		}
		if rec.Code == http.StatusInternalServerError {
			t.Fatalf("%s %s with %s: %q: 500 %s", method, target, hk, hv, rec.Body)
		}
		// An append with a malformed or oversized stored header is a 400.
		key := http.CanonicalHeaderKey(hk)
		if method == http.MethodPost && simpleStreamPath.MatchString(target) &&
			(key == hProducerID || key == hStreamSeq || key == hContentType) &&
			!validHeaderText(hv, key == hContentType) && rec.Code != http.StatusBadRequest {
			t.Fatalf("POST %s with %s: %q: %d %s, want 400", target, key, hv, rec.Code, rec.Body)
		}
	})
}

// simpleStreamPath matches the path of a stream of the Durable Streams
// family without a query.
var simpleStreamPath = regexp.MustCompile(`^/v1/stream/[a-z0-9]+$`)

// marshalingClient marshals every write as gRPC would before answering
// it (codes.Internal when a request cannot be marshalled, as gRPC's
// client does) and fails everything else with UNAVAILABLE.
type marshalingClient struct{ failingClient }

func (marshalingClient) marshal(m proto.Message) error {
	if _, err := proto.Marshal(m); err != nil {
		return status.Error(codes.Internal, "grpc: error while marshaling: "+err.Error())
	}
	return nil
}

func (c marshalingClient) CreateStream(_ context.Context, in *streamv1.CreateStreamRequest, _ ...grpc.CallOption) (*streamv1.CreateStreamResponse, error) {
	if err := c.marshal(in); err != nil {
		return nil, err
	}
	return &streamv1.CreateStreamResponse{Created: true, Info: &streamv1.StreamInfo{NextOffset: "0_0", ContentType: in.GetContentType()}}, nil
}

func (c marshalingClient) Append(_ context.Context, in *streamv1.AppendRequest, _ ...grpc.CallOption) (*streamv1.AppendResponse, error) {
	if err := c.marshal(in); err != nil {
		return nil, err
	}
	return &streamv1.AppendResponse{NextOffset: "0_1"}, nil
}

func (c marshalingClient) PutSnapshot(_ context.Context, in *streamv1.PutSnapshotRequest, _ ...grpc.CallOption) (*streamv1.PutSnapshotResponse, error) {
	if err := c.marshal(in); err != nil {
		return nil, err
	}
	return &streamv1.PutSnapshotResponse{Offset: in.GetOffset(), Digest: "d"}, nil
}

func (c marshalingClient) CommitSnapshot(_ context.Context, in *streamv1.CommitSnapshotRequest, _ ...grpc.CallOption) (*streamv1.CommitSnapshotResponse, error) {
	if err := c.marshal(in); err != nil {
		return nil, err
	}
	return &streamv1.CommitSnapshotResponse{Offset: in.GetOffset(), Digest: "d"}, nil
}
