package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

func TestGet(t *testing.T) {
	i := Get()
	if i.Version == "" || i.Commit == "" {
		t.Fatalf("empty fields: %+v", i)
	}
	if i.GoVersion != runtime.Version() {
		t.Fatalf("go version %q, want %q", i.GoVersion, runtime.Version())
	}
	s := i.String("ursula")
	for _, want := range []string{"ursula ", i.Version, "commit " + i.Commit, runtime.Version()} {
		if !strings.Contains(s, want) {
			t.Errorf("%q lacks %q", s, want)
		}
	}
}
