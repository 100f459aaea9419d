package telemetry

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/trace"
)

// ComponentKey is the logger attribute that names a component
// (logger.With("component", "engine")); per-component levels key on it.
const ComponentKey = "component"

// Levels are per-component log levels, by the value of the "component"
// attribute.
type Levels map[string]slog.Level

// ParseLevels parses the [log] levels table: component name to level name
// (debug, info, warn, error, or those with an offset such as "debug+2").
// A key may be a package path ("storage/engine"): its last element names
// the component.
func ParseLevels(m map[string]string) (Levels, error) {
	out := make(Levels, len(m))
	for _, k := range slices.Sorted(maps.Keys(m)) {
		name := k
		if i := strings.LastIndexByte(name, '/'); i >= 0 {
			name = name[i+1:]
		}
		if name == "" {
			return nil, fmt.Errorf("log.levels: empty component name in %q", k)
		}
		var l slog.Level
		if err := l.UnmarshalText([]byte(m[k])); err != nil {
			return nil, fmt.Errorf("log.levels %q: %w", k, err)
		}
		out[name] = l
	}
	return out, nil
}

// ParseLevelList parses the command-line form of [log] levels,
// "engine=debug,gateway=warn", into the table form.
func ParseLevelList(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, v, ok := strings.Cut(item, "=")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if !ok || k == "" || v == "" {
			return nil, fmt.Errorf("log.levels: %q is not component=level", item)
		}
		out[k] = v
	}
	return out, nil
}

// Min returns the lowest of base and every per-component level: the level
// the wrapped handler must let through.
func (l Levels) Min(base slog.Level) slog.Level {
	m := base
	for _, v := range l {
		m = min(m, v)
	}
	return m
}

// LogHandler wraps a slog.Handler. A record passes if its level reaches the
// level of its logger's component (bound with With("component", name)
// before any WithGroup) or, without one, the base level. Records logged
// with a context that carries a valid span get trace_id and span_id.
type LogHandler struct {
	inner  slog.Handler
	levels Levels
	base   slog.Level
	level  slog.Level
	// grouped is set after WithGroup: later attributes are qualified, so a
	// "component" among them is not the component.
	grouped bool
}

// NewLogHandler wraps inner, which must itself let through levels.Min(base)
// and above.
func NewLogHandler(inner slog.Handler, base slog.Level, levels Levels) *LogHandler {
	return &LogHandler{inner: inner, levels: levels, base: base, level: base}
}

// Enabled reports whether a record at level l passes.
func (h *LogHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.level && h.inner.Enabled(ctx, l)
}

// Handle adds the span's ids, if any, and passes r on.
func (h *LogHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.inner.Handle(ctx, r)
}

// WithAttrs binds attrs; a "component" among them selects that
// component's level (the base level for a component without one, even
// under a logger of another component).
func (h *LogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	n := *h
	n.inner = h.inner.WithAttrs(attrs)
	if !h.grouped {
		for _, a := range attrs {
			if a.Key != ComponentKey {
				continue
			}
			n.level = h.base
			if l, ok := h.levels[a.Value.String()]; ok {
				n.level = l
			}
		}
	}
	return &n
}

// WithGroup opens a group.
func (h *LogHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	n := *h
	n.inner = h.inner.WithGroup(name)
	n.grouped = true
	return &n
}
