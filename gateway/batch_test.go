package gateway

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// framed encodes payloads as an append-batch body.
func framed(payloads ...string) string {
	var b []byte
	for _, p := range payloads {
		b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
		b = append(b, p...)
	}
	return string(b)
}

func TestAppendBatch(t *testing.T) {
	okResp := &streamv1.AppendResponse{NextOffset: "0_9", RecordStart: 3, RecordNext: 5, Frames: []*streamv1.FrameAck{
		{Status: 200, NextOffset: "0_4", RecordStart: 3, RecordNext: 4},
		{Status: 200, NextOffset: "0_9", RecordStart: 4, RecordNext: 5},
	}}
	partResp := &streamv1.AppendResponse{NextOffset: "0_4", RecordStart: 3, RecordNext: 4, Frames: []*streamv1.FrameAck{
		{Status: 200, NextOffset: "0_4", RecordStart: 3, RecordNext: 4},
		{Status: 400, ErrorCode: "INVALID_ARGUMENT", Error: "bad json"},
	}}
	tests := []struct {
		name       string
		body       string
		hdr        map[string]string
		resp       *streamv1.AppendResponse
		err        error
		wantStatus int
		wantFrames int
		wantAcks   string
		check      func(t *testing.T, req *streamv1.AppendRequest, h http.Header)
	}{
		{name: "two frames", body: framed("1", "[2]"), hdr: map[string]string{"Content-Type": "application/json"}, resp: okResp,
			wantStatus: 200, wantFrames: 2,
			wantAcks: `[{"status":200,"stream_next_offset":"0_4","stream_closed":false,"record_start":3,"record_next":4,"error_code":null,"error":null},` +
				`{"status":200,"stream_next_offset":"0_9","stream_closed":false,"record_start":4,"record_next":5,"error_code":null,"error":null}]`,
			check: func(t *testing.T, req *streamv1.AppendRequest, h http.Header) {
				if string(req.GetFrames()[1]) != "[2]" || req.GetContentType() != "application/json" {
					t.Fatalf("request %v", req)
				}
				if h.Get("Stream-Record-Start") != "3" || h.Get("Stream-Record-Next") != "5" || h.Get("Stream-Next-Offset") != "0_9" {
					t.Fatalf("headers %v", h)
				}
			}},
		{name: "minimal", body: framed("1", "2"), hdr: map[string]string{"Content-Type": "application/json", "Prefer": "return=minimal"}, resp: okResp,
			wantStatus: 204, wantFrames: 2},
		{name: "minimal with a failed frame answers the acks", body: framed("1", "x"), hdr: map[string]string{"Content-Type": "application/json", "Prefer": "return=minimal"}, resp: partResp,
			wantStatus: 200, wantFrames: 2,
			wantAcks: `[{"status":200,"stream_next_offset":"0_4","stream_closed":false,"record_start":3,"record_next":4,"error_code":null,"error":null},` +
				`{"status":400,"stream_next_offset":null,"stream_closed":false,"record_start":null,"record_next":null,"error_code":"INVALID_ARGUMENT","error":"bad json"}]`},
		{name: "producer and record match pass through", body: framed("a"),
			hdr:        map[string]string{"Content-Type": "text/plain", "Producer-Id": "p", "Producer-Epoch": "1", "Producer-Seq": "2", "Stream-Record-Match": "7"},
			resp:       &streamv1.AppendResponse{NextOffset: "0_1", ProducerEpoch: 1, ProducerSeq: 2, Frames: []*streamv1.FrameAck{{Status: 200, NextOffset: "0_1"}}},
			wantStatus: 200, wantFrames: 1,
			check: func(t *testing.T, req *streamv1.AppendRequest, h http.Header) {
				if req.GetProducer().GetSeq() != 2 || req.GetRecordMatch() != 7 {
					t.Fatalf("request %v", req)
				}
				if h.Get("Producer-Seq") != "2" || h.Get("Stream-Record-Start") != "" {
					t.Fatalf("headers %v", h)
				}
			}},
		{name: "record mismatch", body: framed("1"), hdr: map[string]string{"Content-Type": "application/json", "Stream-Record-Match": "1"},
			err:        grpcerr.ToStatus(errcode.New(errcode.RecordMismatch, "no").With(errcode.KeyRecordNext, "4").With(errcode.KeyNextOffset, "0_8")),
			wantStatus: 412, wantFrames: 1,
			check: func(t *testing.T, _ *streamv1.AppendRequest, h http.Header) {
				if h.Get("Stream-Record-Next") != "4" || h.Get("Stream-Next-Offset") != "0_8" {
					t.Fatalf("headers %v", h)
				}
			}},
		{name: "zero-length frame", body: framed("1", ""), hdr: map[string]string{"Content-Type": "application/json"}, wantStatus: 400},
		{name: "truncated length", body: "\x00\x00", hdr: map[string]string{"Content-Type": "application/json"}, wantStatus: 400},
		{name: "truncated payload", body: "\x00\x00\x00\x05ab", hdr: map[string]string{"Content-Type": "application/json"}, wantStatus: 400},
		{name: "empty body", body: "", hdr: map[string]string{"Content-Type": "application/json"}, wantStatus: 400},
		{name: "no content type", body: framed("1"), wantStatus: 400},
		{name: "bad record match", body: framed("1"), hdr: map[string]string{"Content-Type": "application/json", "Stream-Record-Match": "-1"}, wantStatus: 400},
		{name: "too many frames", body: framed(strings.Split(strings.Repeat("x", maxBatchFrames+1), "")...), hdr: map[string]string{"Content-Type": "text/plain"}, wantStatus: 413},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got *streamv1.AppendRequest
			f := &fakeClient{appendFn: func(in *streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
				got = in
				return tc.resp, tc.err
			}}
			g := newTestGateway(t, f, nil)
			rec := do(t, g, "POST", "http://x/bkt/s/append-batch", tc.body, tc.hdr)
			if rec.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			if tc.wantFrames > 0 && len(got.GetFrames()) != tc.wantFrames {
				t.Fatalf("frames %d, want %d", len(got.GetFrames()), tc.wantFrames)
			}
			if tc.wantAcks != "" && strings.TrimSpace(rec.Body.String()) != tc.wantAcks {
				t.Fatalf("acks\n%s\nwant\n%s", rec.Body, tc.wantAcks)
			}
			if tc.check != nil {
				tc.check(t, got, rec.Header())
			}
		})
	}
}

func TestAppendBatchMethod(t *testing.T) {
	g := newTestGateway(t, &fakeClient{}, nil)
	if rec := do(t, g, "GET", "http://x/bkt/s/append-batch", "", nil); rec.Code != 405 {
		t.Fatalf("status %d", rec.Code)
	}
}

func TestAppendRecordHeaders(t *testing.T) {
	tests := []struct {
		name       string
		hdr        map[string]string
		err        error
		wantStatus int
		wantMatch  *uint64
		wantStart  string
	}{
		{name: "json append answers its range", hdr: map[string]string{"Content-Type": "application/json"}, wantStatus: 204, wantStart: "2"},
		{name: "record match", hdr: map[string]string{"Content-Type": "application/json", "Stream-Record-Match": "2"}, wantStatus: 204, wantMatch: new(uint64(2)), wantStart: "2"},
		{name: "record match mismatch", hdr: map[string]string{"Content-Type": "application/json", "Stream-Record-Match": "1"},
			err: grpcerr.ToStatus(errcode.New(errcode.RecordMismatch, "no").With(errcode.KeyRecordNext, "2")), wantStatus: 412, wantMatch: new(uint64(1))},
		{name: "bad record match", hdr: map[string]string{"Content-Type": "application/json", "Stream-Record-Match": "01"}, wantStatus: 400},
		{name: "text append has no record headers", hdr: map[string]string{"Content-Type": "text/plain"}, wantStatus: 204},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got *streamv1.AppendRequest
			f := &fakeClient{appendFn: func(in *streamv1.AppendRequest) (*streamv1.AppendResponse, error) {
				got = in
				if tc.err != nil {
					return nil, tc.err
				}
				return &streamv1.AppendResponse{NextOffset: "0_4", RecordStart: 2, RecordNext: 3}, nil
			}}
			g := newTestGateway(t, f, nil)
			rec := do(t, g, "POST", "http://x/bkt/s", "1", tc.hdr)
			if rec.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			if tc.wantMatch != nil && (got.RecordMatch == nil || *got.RecordMatch != *tc.wantMatch) {
				t.Fatalf("record match %v", got.RecordMatch)
			}
			if h := rec.Header().Get("Stream-Record-Start"); h != tc.wantStart {
				t.Fatalf("Stream-Record-Start = %q, want %q", h, tc.wantStart)
			}
			if tc.wantStatus == 412 && rec.Header().Get("Stream-Record-Next") != "2" {
				t.Fatalf("headers %v", rec.Header())
			}
		})
	}
}

func TestHeadRecordRange(t *testing.T) {
	f := &fakeClient{head: func(*streamv1.HeadRequest) (*streamv1.HeadResponse, error) {
		return &streamv1.HeadResponse{Info: &streamv1.StreamInfo{ContentType: "application/json", NextOffset: "0_9", RecordFirst: 2, RecordNext: 7}}, nil
	}}
	g := newTestGateway(t, f, nil)
	rec := do(t, g, "HEAD", "http://x/bkt/s", "", nil)
	if rec.Code != 200 || rec.Header().Get("Stream-Record-First") != "2" || rec.Header().Get("Stream-Record-Next") != "7" {
		t.Fatalf("status %d headers %v", rec.Code, rec.Header())
	}
}

func TestReadRecords(t *testing.T) {
	data := []byte("{\"a\":1}\n2\n")
	tests := []struct {
		name       string
		query      string
		wantStatus int
		check      func(t *testing.T, req *streamv1.ReadRequest)
		wantBody   string
		wantCT     string
	}{
		{name: "record start", query: "record=5", wantStatus: 200, wantBody: `[{"a":1},2]`, wantCT: "application/json",
			check: func(t *testing.T, req *streamv1.ReadRequest) {
				if req.Record == nil || req.GetRecord() != 5 {
					t.Fatalf("request %v", req)
				}
			}},
		{name: "record now", query: "record=now", wantStatus: 200, check: func(t *testing.T, req *streamv1.ReadRequest) {
			if !req.GetRecordNow() {
				t.Fatalf("request %v", req)
			}
		}},
		{name: "tail records with max", query: "tail_records=3&max_records=2", wantStatus: 200, check: func(t *testing.T, req *streamv1.ReadRequest) {
			if req.GetTailRecords() != 3 || req.GetMaxRecords() != 2 {
				t.Fatalf("request %v", req)
			}
		}},
		{name: "envelope", query: "record=5&record_view=envelope", wantStatus: 200,
			wantBody: "{\"record\":5,\"value\":{\"a\":1}}\n{\"record\":6,\"value\":2}\n", wantCT: ctRecordsNDJSON},
		{name: "max records without a start", query: "max_records=2", wantStatus: 400},
		{name: "max records with max bytes", query: "record=1&max_records=2&max_bytes=9", wantStatus: 400},
		{name: "record and offset", query: "record=1&offset=-1", wantStatus: 400},
		{name: "record and tail", query: "record=1&tail_records=2", wantStatus: 400},
		{name: "bad record", query: "record=x", wantStatus: 400},
		{name: "zero tail", query: "tail_records=0", wantStatus: 400},
		{name: "bad view", query: "record=1&record_view=raw", wantStatus: 400},
		{name: "sse with max records", query: "record=1&max_records=2&live=sse", wantStatus: 400},
		{name: "sse with envelope", query: "record=1&record_view=envelope&live=sse", wantStatus: 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeClient{read: func(_ context.Context, in *streamv1.ReadRequest) (*streamv1.ReadResponse, error) {
				if tc.check != nil {
					tc.check(t, in)
				}
				return &streamv1.ReadResponse{Data: data, StartOffset: "0_0", NextOffset: "0_10", ContentType: "application/json",
					RecordFirst: 5, RecordNext: 7}, nil
			}}
			g := newTestGateway(t, f, nil)
			rec := do(t, g, "GET", "http://x/bkt/s?"+tc.query, "", nil)
			if rec.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.wantStatus, rec.Body)
			}
			if rec.Code != 200 {
				return
			}
			if rec.Header().Get("Stream-Record-First") != "5" || rec.Header().Get("Stream-Record-Next") != "7" {
				t.Fatalf("headers %v", rec.Header())
			}
			if tc.wantBody != "" && rec.Body.String() != tc.wantBody {
				t.Fatalf("body %q, want %q", rec.Body, tc.wantBody)
			}
			if tc.wantCT != "" && rec.Header().Get("Content-Type") != tc.wantCT {
				t.Fatalf("Content-Type %q", rec.Header().Get("Content-Type"))
			}
		})
	}
}

func TestAppendEnvelope(t *testing.T) {
	var got []byte
	renderEnvelope([]byte("1\n\"x\"\n"), 9, func(b []byte) { got = append(got, b...) })
	var lines []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(string(got), "\n"), "\n") {
		var v map[string]any
		if err := json.Unmarshal([]byte(l), &v); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		lines = append(lines, v)
	}
	if len(lines) != 2 || lines[0]["record"] != float64(9) || lines[1]["value"] != "x" {
		t.Fatalf("envelope %s", got)
	}
}
