package gateway

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// attrBucket is the span attribute naming the bucket a request addresses.
const attrBucket = attribute.Key("ursula.bucket")

// attrHubTraceID and attrHubSpanID name, on the span event of an SSE
// request that joins a running hub, the span its upstream subscription
// descends from (the request that started the hub).
const (
	attrHubTraceID = attribute.Key("ursula.sse.hub.trace_id")
	attrHubSpanID  = attribute.Key("ursula.sse.hub.span_id")
)

// serverSpanOptions are the options of every request's span, made once
// (an option is an interface value: made per request, it is an allocation).
var serverSpanOptions = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindServer)}

// traceCarrier is propagation.HeaderCarrier without the allocation
// http.Header.Get makes to canonicalize a key given in lower case: the W3C
// propagators ask for "traceparent", "tracestate" and "baggage" on every
// request, mostly to find nothing.
type traceCarrier http.Header

// canonicalTraceKey returns the canonical form of the keys the W3C
// propagators ask for, and key itself for any other.
func canonicalTraceKey(key string) string {
	switch key {
	case "traceparent":
		return "Traceparent"
	case "tracestate":
		return "Tracestate"
	case "baggage":
		return "Baggage"
	}
	return http.CanonicalHeaderKey(key)
}

func (c traceCarrier) Get(key string) string {
	if v := c[canonicalTraceKey(key)]; len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c traceCarrier) Values(key string) []string { return c[canonicalTraceKey(key)] }

func (c traceCarrier) Set(key, value string) { http.Header(c).Set(key, value) }

func (c traceCarrier) Keys() []string { return propagation.HeaderCarrier(c).Keys() }

var _ propagation.ValuesGetter = traceCarrier(nil)

// startSpan starts the server span of a request, as a child of the span in
// its traceparent header, if any. The span is named "<method> <route>"
// (the route template, never the stream name) and carries the HTTP
// semantic conventions' server attributes (http.request.method,
// url.scheme, http.route, server.address and server.port,
// network.protocol.version, client.address, user_agent.original; at the
// end http.response.status_code) and the bucket; never the body, and never
// url.path or url.query: stream names are the users' data, so the route
// template stands for the path. Without a tracer provider it costs a
// context value.
func (g *Gateway) startSpan(r *http.Request) (context.Context, trace.Span) {
	ctx := otel.GetTextMapPropagator().Extract(r.Context(), traceCarrier(r.Header))
	ctx, span := tracer.Start(ctx, r.Method, serverSpanOptions...)
	if !span.IsRecording() {
		if !span.SpanContext().IsValid() {
			// Nothing to record or pass on (no tracing, no parent): the
			// request keeps its context, and serveHTTP its request
			// (a copy per request otherwise).
			return r.Context(), span
		}
		return ctx, span
	}
	method := r.Method
	if methodIndex(method) == len(methodNames)-1 {
		method = "_OTHER"
	}
	route, bucket := g.routes.of(r.URL.Path)
	name := method
	if method == "_OTHER" {
		name = "HTTP"
	}
	span.SetName(name + " " + route)
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	attrs := []attribute.KeyValue{
		semconv.HTTPRequestMethodKey.String(method),
		semconv.HTTPRoute(route),
		semconv.URLScheme(scheme),
		semconv.NetworkProtocolVersion(protocolVersion(r)),
	}
	if r.Method != method {
		attrs = append(attrs, semconv.HTTPRequestMethodOriginal(r.Method))
	}
	if host, port := hostPort(r.Host); host != "" {
		attrs = append(attrs, semconv.ServerAddress(host))
		if port > 0 {
			attrs = append(attrs, semconv.ServerPort(port))
		}
	}
	if host, _ := hostPort(r.RemoteAddr); host != "" {
		attrs = append(attrs, semconv.ClientAddress(host))
	}
	if ua := r.UserAgent(); ua != "" {
		attrs = append(attrs, semconv.UserAgentOriginal(ua))
	}
	if bucket != "" {
		attrs = append(attrs, attrBucket.String(bucket))
	}
	span.SetAttributes(attrs...)
	return ctx, span
}

// protocolVersion is network.protocol.version: "1.1", "2", ...
func protocolVersion(r *http.Request) string {
	switch {
	case r.ProtoMajor == 1:
		return "1." + strconv.Itoa(r.ProtoMinor)
	case r.ProtoMinor == 0:
		return strconv.Itoa(r.ProtoMajor)
	}
	return strconv.Itoa(r.ProtoMajor) + "." + strconv.Itoa(r.ProtoMinor)
}

// hostPort splits "host:port" (or a bare host); port is 0 when absent.
func hostPort(hp string) (string, int) {
	host, p, err := net.SplitHostPort(hp)
	if err != nil {
		return hp, 0
	}
	port, _ := strconv.Atoi(p)
	return host, port
}

// endSpan ends a request's span with its response status (0: none was
// written); 5xx marks the span failed.
func endSpan(span trace.Span, status int) {
	if !span.IsRecording() {
		return
	}
	if status != 0 {
		span.SetAttributes(semconv.HTTPResponseStatusCode(status))
	}
	if status >= 500 {
		span.SetStatus(codes.Error, "")
	}
	span.End()
}

// routeOf returns the route template of path as route dispatches it, and
// the bucket it addresses ("" when none, or when the name is invalid).
func routeOf(root, path string) (route, bucket string) {
	return newRoutes(root).of(path)
}

// routes holds the route templates under a gateway's stream root, built
// once rather than concatenated for every request.
type routes struct {
	root, stream, subscription string
}

func newRoutes(root string) routes {
	return routes{root: root, stream: root + "{stream...}", subscription: root + reservedSegment + "/{subscription...}"}
}

// of is routeOf for the gateway's root.
func (rt routes) of(path string) (route, bucket string) {
	root := rt.root
	if strings.HasPrefix(path, ownPrefix) {
		if isStatusPage(path) {
			return statusPagePrefix + "/{file...}", ""
		}
		switch path[len(ownPrefix):] {
		case "ready", "metrics", "prometheus", "openapi.json":
			return path, ""
		}
		return ownPrefix + "{name}", ""
	}
	if strings.HasPrefix(path, root) {
		rest := path[len(root):]
		if rest == reservedSegment || strings.HasPrefix(rest, reservedSegment+"/") {
			return rt.subscription, BuiltinBucket
		}
		return rt.stream, BuiltinBucket
	}
	if path == root[:len(root)-1] {
		return path, ""
	}
	p := strings.TrimPrefix(path, "/")
	if p == "" {
		return "/", ""
	}
	bucket, stream, hasStream := strings.Cut(p, "/")
	if ValidateBucket(bucket) != nil {
		bucket = ""
	}
	if strings.HasSuffix(stream, "/") && !strings.Contains(stream[:len(stream)-1], "/") {
		stream = stream[:len(stream)-1]
	}
	if !hasStream || stream == "" {
		return "/{bucket}", bucket
	}
	_, sub, hasSub := strings.Cut(stream, "/")
	if !hasSub {
		return "/{bucket}/{stream}", bucket
	}
	if res, arg, _ := strings.Cut(sub, "/"); res == "retention" && arg != "" && !strings.Contains(arg, "/") {
		return "/{bucket}/{stream}/retention/{retention}", bucket
	}
	return "/{bucket}/{stream}/{rest...}", bucket
}
