package telemetry

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/trace"
)

// testLogger logs through a LogHandler into a buffer.
func testLogger(tb testing.TB, base slog.Level, levels Levels) (*slog.Logger, *bytes.Buffer) {
	tb.Helper()
	var buf bytes.Buffer
	inner := slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: levels.Min(base)})
	return slog.New(NewLogHandler(inner, base, levels)), &buf
}

func TestLogHandlerLevels(t *testing.T) {
	levels, err := ParseLevels(map[string]string{"storage/engine": "debug", "gateway": "warn", "node": "debug"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		logger func(*slog.Logger) *slog.Logger
		level  slog.Level
		want   bool
	}{
		{"no component at base", func(l *slog.Logger) *slog.Logger { return l }, slog.LevelInfo, true},
		{"no component below base", func(l *slog.Logger) *slog.Logger { return l }, slog.LevelDebug, false},
		{"engine debug by package path", func(l *slog.Logger) *slog.Logger { return l.With("component", "engine") }, slog.LevelDebug, true},
		{"gateway info below warn", func(l *slog.Logger) *slog.Logger { return l.With("component", "gateway") }, slog.LevelInfo, false},
		{"gateway warn", func(l *slog.Logger) *slog.Logger { return l.With("component", "gateway") }, slog.LevelWarn, true},
		{"unlisted component at base", func(l *slog.Logger) *slog.Logger { return l.With("component", "upstream") }, slog.LevelInfo, true},
		{"unlisted component below base", func(l *slog.Logger) *slog.Logger { return l.With("component", "upstream") }, slog.LevelDebug, false},
		{"sub-component takes its own level", func(l *slog.Logger) *slog.Logger {
			return l.With("component", "node").With("component", "transport")
		}, slog.LevelDebug, false},
		{"component keeps its level under other attrs", func(l *slog.Logger) *slog.Logger {
			return l.With("component", "engine").With("group_id", 3)
		}, slog.LevelDebug, true},
		{"component inside a group does not count", func(l *slog.Logger) *slog.Logger {
			return l.WithGroup("g").With("component", "engine")
		}, slog.LevelDebug, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, buf := testLogger(t, slog.LevelInfo, levels)
			tc.logger(l).Log(t.Context(), tc.level, "hello")
			if got := buf.Len() > 0; got != tc.want {
				t.Fatalf("logged = %v, want %v (output %q)", got, tc.want, buf.String())
			}
		})
	}
}

func TestLogHandlerTraceIDs(t *testing.T) {
	l, buf := testLogger(t, slog.LevelInfo, nil)
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	l.InfoContext(ctx, "with span")
	l.InfoContext(context.Background(), "without span")
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("got %d lines: %q", len(lines), buf.String())
	}
	if !strings.Contains(lines[0], "trace_id=4bf92f3577b34da6a3ce929d0e0e4736") || !strings.Contains(lines[0], "span_id=00f067aa0ba902b7") {
		t.Errorf("record with a span lacks its ids: %q", lines[0])
	}
	if strings.Contains(lines[1], "trace_id") {
		t.Errorf("record without a span has a trace id: %q", lines[1])
	}
}

func TestParseLevels(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    Levels
		wantErr string
	}{
		{"empty", "", Levels{}, ""},
		{"two", "engine=debug, gateway=WARN", Levels{"engine": slog.LevelDebug, "gateway": slog.LevelWarn}, ""},
		{"package path", "storage/engine=error", Levels{"engine": slog.LevelError}, ""},
		{"offset", "node=debug+2", Levels{"node": slog.LevelDebug + 2}, ""},
		{"bad level", "engine=loud", nil, `log.levels "engine"`},
		{"no level", "engine", nil, "not component=level"},
		{"trailing slash", "storage/=debug", nil, "empty component"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, err := ParseLevelList(tc.in)
			var got Levels
			if err == nil {
				got, err = ParseLevels(m)
			}
			switch {
			case tc.wantErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tc.wantErr)
				}
				return
			case err != nil:
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestLevelsMin(t *testing.T) {
	if got := (Levels{"a": slog.LevelWarn, "b": slog.LevelDebug}).Min(slog.LevelInfo); got != slog.LevelDebug {
		t.Errorf("Min = %v, want DEBUG", got)
	}
	if got := (Levels{"a": slog.LevelWarn}).Min(slog.LevelInfo); got != slog.LevelInfo {
		t.Errorf("Min = %v, want INFO", got)
	}
}
