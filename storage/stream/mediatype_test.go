package stream

import (
	"bytes"
	"testing"
)

func TestMediaTypeMatchesGeneralForm(t *testing.T) {
	general := func(ct string) string {
		if i := bytes.IndexByte([]byte(ct), ';'); i >= 0 {
			ct = ct[:i]
		}
		return string(bytes.ToLower(bytes.TrimSpace([]byte(ct))))
	}
	for _, ct := range []string{"", "text/plain", " Text/Plain ; charset=utf-8", "APPLICATION/JSON", "application/json;x=1", "\ttext/x\v", "téxt/PLAIN", "\u00a0text/plain", "a\xffB", "x;y;z", ";"} {
		if got, want := MediaType(ct), general(ct); got != want {
			t.Errorf("MediaType(%q) = %q, want %q", ct, got, want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _ = SameContentType("application/octet-stream", "application/octet-stream") }); n != 0 {
		t.Errorf("SameContentType allocates %v times", n)
	}
}
