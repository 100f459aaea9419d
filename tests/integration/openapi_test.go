package integration

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ursula/ursula/gateway"
	"github.com/ursula/ursula/gateway/subscription"
	"github.com/ursula/ursula/tests/apicheck"
)

// TestDataPlaneOpenAPI reads the data plane's OpenAPI document from a
// gateway in front of a real node, sends a request to every operation of
// both URL families and the gateway's own routes (answers and errors),
// validates each request and answer against the document, and fails on an
// operation it did not reach.
func TestDataPlaneOpenAPI(t *testing.T) {
	n := startNode(t)
	n.serve(t)
	router := startRouter(t, n.clientAddr)
	subs, err := subscription.New(subscription.DefaultConfig(), router, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "subscriptions", subs.Run)
	t.Cleanup(subs.Close)
	_, base := startGateway(t, router, func(c *gateway.Config) {
		c.Subscriptions, c.Observer = subs, subs
		// A long-poll at the tail answers 204 soon.
		c.LongPollTimeout = 50 * time.Millisecond
	})
	hc := httpClient(t)
	// Redirects are answers to check, not to follow.
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	resp, err := hc.Get(base + "/__ursula/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /__ursula/openapi.json: %d %v", resp.StatusCode, err)
	}
	c := apicheck.NewClient(apicheck.Load(t, raw), base, hc)
	hdr := func(kv ...string) http.Header {
		h := http.Header{}
		for i := 0; i+1 < len(kv); i += 2 {
			h.Set(kv[i], kv[i+1])
		}
		return h
	}
	text := hdr("Content-Type", "text/plain")
	jsonType := hdr("Content-Type", "application/json")

	// The gateway's own routes.
	c.Call(t, "GET", "/__ursula/openapi.json", nil, nil, 200)
	c.Call(t, "GET", "/__ursula/ready", nil, nil, 200)
	c.Call(t, "GET", "/__ursula/metrics", nil, nil, 200)
	c.Call(t, "GET", "/__ursula/prometheus", nil, nil, 404)
	// No status page in this gateway (tests/e2e TestStatusPage opens a real one).
	c.Call(t, "GET", "/__ursula/ui/", nil, nil, 404)
	c.Call(t, "GET", "/__ursula/ui/snapshot", nil, nil, 404)
	c.Call(t, "GET", "/__ursula/ui", nil, nil, 404)
	c.Call(t, "GET", "/__ursula/ui/events", nil, nil, 404)
	c.Call(t, "GET", "/__ursula/ui/app.js", nil, nil, 404)
	for _, p := range []string{"/__ursula/ui", "/__ursula/ui/", "/__ursula/ui/snapshot", "/__ursula/ui/events", "/__ursula/ui/app.js"} {
		c.Call(t, "HEAD", p, nil, nil, 404)
	}
	c.Call(t, "HEAD", "/__ursula/openapi.json", nil, nil, 200)
	c.Call(t, "HEAD", "/__ursula/ready", nil, nil, 200)
	c.Call(t, "HEAD", "/__ursula/metrics", nil, nil, 200)
	c.Call(t, "HEAD", "/__ursula/prometheus", nil, nil, 404)

	// The Durable Streams family, a stream id with slashes.
	ds := "/v1/stream/openapi/a"
	created := c.Call(t, "PUT", ds, text, []byte("hello"), 201)
	inc := created.Header.Get("Stream-Incarnation")
	c.Call(t, "PUT", ds, text, nil, 200)
	c.Call(t, "PUT", ds, hdr("Content-Type", "application/json"), nil, 409)
	c.Call(t, "POST", ds, hdr("Content-Type", "text/plain", "Stream-Incarnation", inc), []byte(" world"), 204)
	c.Call(t, "POST", ds, hdr("Content-Type", "text/plain", "Producer-Id", "p1", "Producer-Epoch", "0", "Producer-Seq", "0"), []byte("!"), 200)
	c.Call(t, "POST", ds, hdr("Content-Type", "text/plain", "Stream-Incarnation", "999999"), []byte("x"), 412)
	read := c.Call(t, "GET", ds+"?offset=-1", nil, nil, 200)
	c.Call(t, "GET", ds+"?offset=-1", hdr("If-None-Match", read.Header.Get("ETag")), nil, 304)
	c.Call(t, "GET", ds+"?offset=-1&live=long-poll", nil, nil, 200)
	c.Call(t, "GET", ds+"?offset=now&live=long-poll", nil, nil, 204)
	c.Refused(t, "GET", ds+"?offset=nonsense", nil, nil, 400)
	c.Call(t, "HEAD", ds, nil, nil, 200)
	c.Call(t, "OPTIONS", ds, hdr("Access-Control-Request-Headers", "stream-incarnation"), nil, 204)
	c.Call(t, "POST", ds, hdr("Stream-Closed", "true"), nil, 204)
	c.Call(t, "GET", ds+"?offset=-1&live=sse", nil, nil, 200)
	c.Call(t, "DELETE", ds, nil, nil, 204)
	c.Call(t, "DELETE", ds, nil, nil, 404)
	c.Call(t, "GET", ds, nil, nil, 404)

	// A JSON stream: records.
	js := "/v1/stream/openapi/json"
	c.Call(t, "PUT", js, jsonType, []byte(`[{"n":0},{"n":1}]`), 201)
	c.Call(t, "POST", js, hdr("Content-Type", "application/json", "Stream-Record-Match", "2"), []byte(`{"n":2}`), 204)
	c.Call(t, "POST", js, hdr("Content-Type", "application/json", "Stream-Record-Match", "99"), []byte(`{"n":3}`), 412)
	c.Call(t, "GET", js+"?record=1&max_records=1", nil, nil, 200)
	c.Call(t, "GET", js+"?tail_records=2&record_view=envelope", nil, nil, 200)

	// The subscription APIs: a pull-wake subscription of the JSON stream.
	c.Call(t, "GET", "/v1/stream/__ds/jwks.json", nil, nil, 200)
	c.Call(t, "HEAD", "/v1/stream/__ds/jwks.json", nil, nil, 200)
	c.Call(t, "PUT", "/v1/stream/openapi/wake", jsonType, nil, 201)
	sub := "/v1/stream/__ds/subscriptions/openapi-sub"
	def := []byte(`{"type":"pull-wake","streams":["openapi/json"],"wake_stream":"openapi/wake"}`)
	c.Call(t, "PUT", sub, jsonType, def, 201)
	c.Call(t, "PUT", sub, jsonType, def, 200)
	c.Call(t, "PUT", sub, jsonType, []byte(`{"type":"pull-wake","streams":["openapi/other"],"wake_stream":"openapi/wake"}`), 409)
	c.Call(t, "GET", sub, nil, nil, 200)
	c.Call(t, "GET", "/v1/stream/__ds/subscriptions/missing", nil, nil, 404)
	c.Call(t, "POST", sub+"/streams", jsonType, []byte(`{"streams":["openapi/a"]}`), 204)
	c.Call(t, "DELETE", sub+"/streams/openapi/a", nil, nil, 204)
	c.Call(t, "POST", sub+"/claim", jsonType, []byte(`{"worker":"w1"}`), 409) // nothing pending yet
	c.Call(t, "POST", js, jsonType, []byte(`{"n":3}`), 204)
	claim := c.Call(t, "POST", sub+"/claim", jsonType, []byte(`{"worker":"w1"}`), 200)
	var lease struct {
		WakeID     string `json:"wake_id"`
		Generation uint64 `json:"generation"`
		Token      string `json:"token"`
		Streams    []struct {
			Path       string `json:"path"`
			TailOffset string `json:"tail_offset"`
		} `json:"streams"`
	}
	if err := json.Unmarshal(claim.Body, &lease); err != nil || lease.Token == "" || len(lease.Streams) != 1 {
		t.Fatalf("claim answered %s: %v", claim.Body, err)
	}
	bearer := hdr("Content-Type", "application/json", "Authorization", "Bearer "+lease.Token)
	wake, _ := json.Marshal(map[string]any{"wake_id": lease.WakeID, "generation": lease.Generation})
	c.Call(t, "POST", sub+"/ack", bearer, wake, 200)
	ack, _ := json.Marshal(map[string]any{"wake_id": lease.WakeID, "generation": lease.Generation, "done": true,
		"acks": []map[string]string{{"path": lease.Streams[0].Path, "offset": lease.Streams[0].TailOffset}}})
	c.Call(t, "POST", sub+"/ack", bearer, ack, 200)
	c.Call(t, "POST", sub+"/release", bearer, wake, 409)
	c.Call(t, "POST", sub+"/callback", jsonType, wake, 401)
	c.Call(t, "DELETE", sub, nil, nil, 204)

	// Ursula's family.
	c.Call(t, "PUT", "/openapi-demo", nil, nil, 201)
	c.Call(t, "PUT", "/openapi-demo", nil, nil, 200)
	c.Call(t, "GET", "/openapi-demo", nil, nil, 200)
	c.Refused(t, "PUT", "/__reserved", nil, nil, 400)
	c.Call(t, "GET", "/missing-bucket", nil, nil, 404)
	s := "/openapi-demo/s1"
	c.Call(t, "PUT", s, text, []byte("one;"), 201)
	c.Call(t, "PUT", s, text, nil, 200)
	first := c.Call(t, "POST", s, text, []byte("two;"), 204).Header.Get("Stream-Next-Offset")
	c.Call(t, "GET", s+"?offset=-1", nil, nil, 200)
	c.Call(t, "HEAD", s, nil, nil, 200)
	c.Call(t, "OPTIONS", s, nil, nil, 204)
	c.Call(t, "GET", "/openapi-demo/streams?limit=10", nil, nil, 200)
	c.Refused(t, "GET", "/openapi-demo/streams?limit=0", nil, nil, 400)

	batch := frames("three;", "four;")
	acks := c.Call(t, "POST", s+"/append-batch", text, batch, 200)
	var frameAcks []map[string]any
	if err := json.Unmarshal(acks.Body, &frameAcks); err != nil || len(frameAcks) != 2 {
		t.Errorf("append-batch answered %s: %v", acks.Body, err)
	}
	second := c.Call(t, "POST", s+"/append-batch", hdr("Content-Type", "text/plain", "Prefer", "return=minimal"), frames("five;"), 204).Header.Get("Stream-Next-Offset")
	c.Call(t, "POST", s+"/append-batch", text, []byte{0, 0, 0, 9, 'x'}, 400)

	c.Call(t, "GET", s+"/snapshot", nil, nil, 404)
	c.Call(t, "PUT", s+"/snapshot/"+first, text, []byte("state-1"), 204)
	c.Call(t, "GET", s+"/snapshot/"+first, nil, nil, 200)
	// Staged parts need a cold store, which this node has not.
	c.Call(t, "PUT", s+"/snapshot/"+second+"/parts/1", text, []byte("state-2"), 501)
	commit, _ := json.Marshal(map[string]any{"parts": []map[string]any{{"part": 1, "digest": strings.Repeat("0", 64)}}})
	c.Call(t, "POST", s+"/snapshot/"+second+"/commit", jsonType, commit, 501)
	c.Call(t, "PUT", s+"/snapshot/"+second, text, []byte("state-2"), 204)
	c.Call(t, "GET", s+"/snapshot", nil, nil, 307)
	c.Call(t, "DELETE", s+"/snapshot/"+second, nil, nil, 409)
	c.Call(t, "DELETE", s+"/snapshot/"+first, nil, nil, 404) // replaced by the newer one
	c.Call(t, "GET", s+"/bootstrap", nil, nil, 200)
	c.Call(t, "PUT", s+"/retention/"+second, nil, nil, 204)
	c.Call(t, "GET", s+"?offset="+first, nil, nil, 410)
	c.Call(t, "PUT", s+"/attrs", jsonType, []byte(`{"title":"demo","metadata":{"k":"v"}}`), 204)
	c.Call(t, "GET", s+"/attrs", nil, nil, 200)

	j := "/openapi-demo/j"
	c.Call(t, "PUT", j, jsonType, []byte(`[1,2,3]`), 201)
	c.Call(t, "PUT", j+"/snapshot?record=2", jsonType, []byte(`{"sum":3}`), 204)
	c.Call(t, "PUT", j+"/retention?record=2", nil, nil, 204)

	// Every other method of each documented path is refused.
	for _, target := range []string{
		"/__ursula/openapi.json", "/__ursula/ready", "/__ursula/metrics", "/__ursula/prometheus",
		js, "/openapi-demo", "/openapi-demo/streams", s, s + "/append-batch", s + "/retention/" + second,
		j + "/retention?record=2", s + "/snapshot", s + "/snapshot/" + second, s + "/snapshot/" + second + "/parts/1",
		s + "/snapshot/" + second + "/commit", s + "/bootstrap", s + "/attrs",
	} {
		c.Undocumented(t, target, nil)
	}
	for _, target := range []string{"/v1/stream/__ds/jwks.json", sub, sub + "/streams", sub + "/streams/openapi/a", sub + "/claim", sub + "/ack", sub + "/callback", sub + "/release"} {
		c.Undocumented(t, target, jsonType)
	}

	c.Call(t, "DELETE", "/openapi-demo", nil, nil, 409)
	c.Call(t, "DELETE", s, nil, nil, 204)
	c.Call(t, "DELETE", j, nil, nil, 204)

	if missed := c.Unreached(); len(missed) > 0 {
		t.Errorf("operations of the document this test did not reach: %v", missed)
	}
}

// frames encodes an append-batch body.
func frames(payloads ...string) []byte {
	var b []byte
	for _, p := range payloads {
		b = binary.BigEndian.AppendUint32(b, uint32(len(p)))
		b = append(b, p...)
	}
	return b
}
