package gateway

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/propagation"

	"github.com/ursula/ursula/services/platform/telemetry"
)

func TestRouteOf(t *testing.T) {
	tests := []struct {
		path, route, bucket string
	}{
		{"/v1/stream/events/abc", "/v1/stream/{stream...}", BuiltinBucket},
		{"/v1/stream/x", "/v1/stream/{stream...}", BuiltinBucket},
		{"/v1/stream/__ds", "/v1/stream/__ds/{subscription...}", BuiltinBucket},
		{"/v1/stream/__ds/subscriptions/s1", "/v1/stream/__ds/{subscription...}", BuiltinBucket},
		{"/v1/stream", "/v1/stream", ""},
		{"/__ursula/metrics", "/__ursula/metrics", ""},
		{"/__ursula/prometheus", "/__ursula/prometheus", ""},
		{"/__ursula/secret-stream-name", "/__ursula/{name}", ""},
		{"/", "/", ""},
		{"/photos", "/{bucket}", "photos"},
		{"/photos/", "/{bucket}", "photos"},
		{"/photos/cats", "/{bucket}/{stream}", "photos"},
		{"/photos/cats/", "/{bucket}/{stream}", "photos"},
		{"/photos/cats/retention/7d", "/{bucket}/{stream}/retention/{retention}", "photos"},
		{"/photos/cats/retention/7d/", "/{bucket}/{stream}/{rest...}", "photos"},
		{"/photos/cats/other", "/{bucket}/{stream}/{rest...}", "photos"},
		{"/__system/cats", "/{bucket}/{stream}", ""},
		{"/Bad!Bucket", "/{bucket}", ""},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			route, bucket := routeOf(DefaultStreamRoot, tc.path)
			if route != tc.route || bucket != tc.bucket {
				t.Errorf("routeOf(%q) = %q, %q; want %q, %q", tc.path, route, bucket, tc.route, tc.bucket)
			}
		})
	}
}

func TestPrometheusEndpoint(t *testing.T) {
	t.Run("not configured", func(t *testing.T) {
		g := newTestGateway(t, &fakeClient{}, nil)
		if rec := do(t, g, "GET", "/__ursula/prometheus", "", nil); rec.Code != http.StatusNotFound {
			t.Fatalf("GET without a handler: %d, want 404", rec.Code)
		}
	})
	t.Run("configured", func(t *testing.T) {
		prom := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; version=0.0.4")
			_, _ = w.Write([]byte("ursula_gateway_requests_total 1\n"))
		})
		g := newTestGateway(t, &fakeClient{}, func(c *Config) { c.Prometheus = prom })
		rec := do(t, g, "GET", "/__ursula/prometheus", "", nil)
		if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain") || rec.Body.String() != "ursula_gateway_requests_total 1\n" {
			t.Fatalf("GET: %d %q %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String())
		}
		if rec := do(t, g, "POST", "/__ursula/prometheus", "", nil); rec.Code != http.StatusMethodNotAllowed {
			t.Fatalf("POST: %d, want 405", rec.Code)
		}
	})
}

// TestMetricsSource reads the request counters as samples with method and
// status attributes.
func TestMetricsSource(t *testing.T) {
	g := newTestGateway(t, &fakeClient{}, nil)
	do(t, g, "GET", "/__ursula/metrics", "", nil)
	do(t, g, "GET", "/__ursula/metrics", "", nil)
	do(t, g, "GET", "/nope!", "", nil)
	got := map[string]float64{}
	g.MetricsSource()(func(s telemetry.Sample) {
		key := s.Name
		for _, a := range s.Attrs {
			key += " " + string(a.Key) + "=" + a.Value.String()
		}
		got[key] = s.Value
	})
	for key, want := range map[string]float64{
		"requests http.request.method=GET http.response.status_code=200": 2,
		"requests http.request.method=GET http.response.status_code=400": 1,
		"sse_clients":     0,
		"upstream_errors": 0,
	} {
		if got[key] != want {
			t.Errorf("%s = %v, want %v (all: %v)", key, got[key], want, got)
		}
	}
}

// TestTraceCarrier checks the carrier the propagators read a request's
// headers through: it must find what propagation.HeaderCarrier finds.
func TestTraceCarrier(t *testing.T) {
	h := http.Header{}
	h.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	h.Set("tracestate", "vendor=1")
	h.Add("baggage", "a=1")
	h.Add("baggage", "b=2")
	h.Set("x-other", "v")
	c, want := traceCarrier(h), propagation.HeaderCarrier(h)
	for _, key := range []string{"traceparent", "Traceparent", "tracestate", "baggage", "x-other", "X-Other", "missing"} {
		t.Run(key, func(t *testing.T) {
			if got, w := c.Get(key), want.Get(key); got != w {
				t.Errorf("Get = %q, want %q", got, w)
			}
			if got, w := c.Values(key), want.Values(key); !slices.Equal(got, w) {
				t.Errorf("Values = %q, want %q", got, w)
			}
		})
	}
	c.Set("traceparent", "x")
	if got := h.Get("Traceparent"); got != "x" {
		t.Errorf("after Set, header %q, want x", got)
	}
	if got, w := c.Keys(), want.Keys(); len(got) != len(w) {
		t.Errorf("Keys = %q, want %q", got, w)
	}
}
