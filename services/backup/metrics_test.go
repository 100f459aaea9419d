package backup

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ursula/ursula/services/platform/telemetry"
	"github.com/ursula/ursula/tests/otelcheck"
)

// TestMetricsConventions: every numeric value of the metrics document has
// an instrument, and the exposition passes the Prometheus linter.
func TestMetricsConventions(t *testing.T) {
	s := &Service{}
	s.metrics.backups.Add(2)
	if missing := document.Undescribed(s.metrics.snapshot()); len(missing) > 0 {
		t.Errorf("metrics document values without an instrument: %v", missing)
	}
	tel, err := telemetry.New(t.Context(), telemetry.Config{Prometheus: true}, telemetry.Identity{ServiceName: "backup-test"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tel.Shutdown(context.Background()) })
	if err := tel.RegisterSource("backup", s.MetricsSource()); err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	tel.PrometheusHandler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/__ursula/prometheus", nil))
	text := rec.Body.String()
	for _, p := range otelcheck.Lint(t, text) {
		t.Errorf("promlint: %s", p)
	}
	for _, want := range []string{"ursula_backup_backups_total 2", "ursula_backup_last_success_unix_seconds 0", "ursula_backup_last_bytes 0", "ursula_build_info{"} {
		if !strings.Contains(text, want) {
			t.Errorf("no %q in:\n%s", want, text)
		}
	}
}
