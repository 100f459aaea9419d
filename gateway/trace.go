package gateway

import (
	"context"
	"net/http"
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

// startSpan starts the server span of a request, as a child of the span in
// its traceparent header, if any. The span is named "<method> <route>"
// (the route template, never the stream name) and records the method, the
// route and the bucket; never the body. Without a tracer provider it costs
// a context value.
func (g *Gateway) startSpan(r *http.Request) (context.Context, trace.Span) {
	ctx := otel.GetTextMapPropagator().Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	ctx, span := tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer))
	if !span.IsRecording() {
		return ctx, span
	}
	method := r.Method
	if methodIndex(method) == len(methodNames)-1 {
		method = "_OTHER"
	}
	route, bucket := routeOf(g.cfg.StreamRoot, r.URL.Path)
	name := method
	if method == "_OTHER" {
		name = "HTTP"
	}
	span.SetName(name + " " + route)
	attrs := []attribute.KeyValue{semconv.HTTPRequestMethodKey.String(method), semconv.HTTPRoute(route)}
	if bucket != "" {
		attrs = append(attrs, attrBucket.String(bucket))
	}
	span.SetAttributes(attrs...)
	return ctx, span
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
	if strings.HasPrefix(path, ownPrefix) {
		if isStatusPage(path) {
			return statusPagePrefix + "/{file...}", ""
		}
		switch path[len(ownPrefix):] {
		case "ready", "metrics", "prometheus":
			return path, ""
		}
		return ownPrefix + "{name}", ""
	}
	if strings.HasPrefix(path, root) {
		rest := path[len(root):]
		if rest == reservedSegment || strings.HasPrefix(rest, reservedSegment+"/") {
			return root + reservedSegment + "/{subscription...}", BuiltinBucket
		}
		return root + "{stream...}", BuiltinBucket
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
