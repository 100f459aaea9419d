package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"time"
)

// StreamRoot is the path prefix of the Durable Streams URL family.
const StreamRoot = "/v1/stream/"

// Client speaks the Durable Streams protocol to one gateway.
type Client struct {
	BaseURL string
	HTTP    *http.Client
}

// NewClient returns a client for baseURL (e.g. http://127.0.0.1:4437) with a
// connection pool large enough for concurrent test writers.
func NewClient(baseURL string) *Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        512,
		MaxIdleConnsPerHost: 512,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{BaseURL: baseURL, HTTP: &http.Client{Transport: tr, Timeout: 30 * time.Second}}
}

// Producer is an idempotent producer's (id, epoch, seq) tuple.
type Producer struct {
	ID    string
	Epoch uint64
	Seq   uint64
}

// Response is a fully read HTTP response.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// NextOffset is the Stream-Next-Offset header.
func (r *Response) NextOffset() string { return r.Header.Get("Stream-Next-Offset") }

// UpToDate reports Stream-Up-To-Date: true.
func (r *Response) UpToDate() bool { return r.Header.Get("Stream-Up-To-Date") == "true" }

// String summarises the response for error messages.
func (r *Response) String() string {
	body := r.Body
	if len(body) > 300 {
		body = body[:300]
	}
	return fmt.Sprintf("%d %s (Stream-Next-Offset %q) %q", r.Status, http.StatusText(r.Status), r.NextOffset(), body)
}

// StreamURL is the URL of a stream in the Durable Streams family.
func (c *Client) StreamURL(stream string) string { return c.BaseURL + StreamRoot + stream }

// Do sends one request to a stream's URL and reads the whole answer.
func (c *Client) Do(ctx context.Context, method, stream string, query url.Values, header http.Header, body []byte) (*Response, error) {
	u := c.StreamURL(stream)
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	for k, vs := range header {
		req.Header[k] = vs
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("%s %s: read body: %w", method, u, err)
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// Create creates a stream (PUT) with an optional first body.
func (c *Client) Create(ctx context.Context, stream, contentType string, body []byte) (*Response, error) {
	h := http.Header{}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	return c.Do(ctx, http.MethodPut, stream, nil, h, body)
}

// Append appends body (POST), as producer p when p is not nil.
func (c *Client) Append(ctx context.Context, stream, contentType string, body []byte, p *Producer) (*Response, error) {
	h := http.Header{}
	h.Set("Content-Type", contentType)
	if p != nil {
		h.Set("Producer-Id", p.ID)
		h.Set("Producer-Epoch", strconv.FormatUint(p.Epoch, 10))
		h.Set("Producer-Seq", strconv.FormatUint(p.Seq, 10))
	}
	return c.Do(ctx, http.MethodPost, stream, nil, h, body)
}

// Read is one catch-up GET from offset.
func (c *Client) Read(ctx context.Context, stream, offset string) (*Response, error) {
	return c.Do(ctx, http.MethodGet, stream, url.Values{"offset": {offset}}, nil, nil)
}

// ReadAll reads a stream from the start to its tail, following
// Stream-Next-Offset page by page, and checks that the pages are contiguous:
// each page starts at the byte position its request offset names. It returns
// the bytes and the tail offset.
func (c *Client) ReadAll(ctx context.Context, stream string) ([]byte, string, error) {
	var data []byte
	offset := "-1"
	for page := 0; ; page++ {
		if page > 1_000_000 {
			return nil, "", fmt.Errorf("read %s: no tail after %d pages", stream, page)
		}
		resp, err := c.Read(ctx, stream, offset)
		if err != nil {
			return nil, "", fmt.Errorf("read %s at %s: %w", stream, offset, err)
		}
		if resp.Status != http.StatusOK {
			return nil, "", fmt.Errorf("read %s at %s: %v", stream, offset, resp)
		}
		next := resp.NextOffset()
		nextOff, err := ParseOffset(next)
		if err != nil {
			return nil, "", fmt.Errorf("read %s at %s: Stream-Next-Offset: %w", stream, offset, err)
		}
		if want := uint64(len(data)) + uint64(len(resp.Body)); nextOff.Pos != want {
			return nil, "", fmt.Errorf("read %s at %s: %d bytes from byte %d, but Stream-Next-Offset %s names byte %d",
				stream, offset, len(resp.Body), len(data), next, nextOff.Pos)
		}
		data = append(data, resp.Body...)
		if resp.UpToDate() {
			return data, next, nil
		}
		if len(resp.Body) == 0 {
			return nil, "", fmt.Errorf("read %s at %s: empty page that is not up to date", stream, offset)
		}
		offset = next
	}
}

// Offset is a stream offset token, %016d_%016d: a read sequence and the byte
// position in the stream.
type Offset struct {
	Seq uint64
	Pos uint64
}

var offsetRE = regexp.MustCompile(`^([0-9]{16})_([0-9]{16})$`)

// ParseOffset parses an offset token the server issued.
func ParseOffset(s string) (Offset, error) {
	m := offsetRE.FindStringSubmatch(s)
	if m == nil {
		return Offset{}, fmt.Errorf("offset %q is not of the form %%016d_%%016d", s)
	}
	seq, err1 := strconv.ParseUint(m[1], 10, 64)
	pos, err2 := strconv.ParseUint(m[2], 10, 64)
	if err1 != nil || err2 != nil {
		return Offset{}, fmt.Errorf("offset %q out of range", s)
	}
	return Offset{Seq: seq, Pos: pos}, nil
}

func (o Offset) String() string { return fmt.Sprintf("%016d_%016d", o.Seq, o.Pos) }
