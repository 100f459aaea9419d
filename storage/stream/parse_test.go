package stream

import (
	"bytes"
	"encoding/json"
	"testing"
	"unicode/utf8"
)

func TestParseOffset(t *testing.T) {
	tests := []struct {
		in      string
		want    ParsedOffset
		wantErr bool
	}{
		{"-1", ParsedOffset{Start: true}, false},
		{"now", ParsedOffset{Now: true}, false},
		{"0000000000000000_0000000000000000", ParsedOffset{}, false},
		{"0000000000000000_0000000000000042", ParsedOffset{Pos: 42}, false},
		{"", ParsedOffset{}, true},
		{"12", ParsedOffset{}, true},
		{"_1", ParsedOffset{}, true},
		{"1_", ParsedOffset{}, true},
		{"1_2_3", ParsedOffset{}, true},
		{"1,2", ParsedOffset{}, true},
		{"0_99999999999999999999", ParsedOffset{}, true},
		{" 1_2", ParsedOffset{}, true},
		{"../1_2", ParsedOffset{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseOffset(tc.in)
			if (err != nil) != tc.wantErr || (err == nil && got != tc.want) {
				t.Fatalf("ParseOffset(%q) = %+v, %v", tc.in, got, err)
			}
		})
	}
	if FormatOffset(42) != "0000000000000000_0000000000000042" {
		t.Fatalf("FormatOffset(42) = %s", FormatOffset(42))
	}
}

func FuzzParseOffset(f *testing.F) {
	for _, s := range []string{"-1", "now", "0000000000000000_0000000000000000", "1_2", "x", "9_18446744073709551615", "9_18446744073709551616"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParseOffset(s)
		if err != nil {
			return
		}
		if !p.Start && !p.Now {
			// A parsed position must round-trip through the canonical form.
			q, err := ParseOffset(FormatOffset(p.Pos))
			if err != nil || q.Pos != p.Pos {
				t.Fatalf("offset %q does not round-trip", s)
			}
		}
	})
}

func TestFlattenJSON(t *testing.T) {
	tests := []struct {
		name       string
		in         string
		allowEmpty bool
		want       string
		n          int
		wantErr    bool
	}{
		{"object", `{"a": 1}`, false, "{\"a\":1}\n", 1, false},
		{"array flattened one level", `[[1,2],[3,4]]`, false, "[1,2]\n[3,4]\n", 2, false},
		{"scalar", ` 5 `, false, "5\n", 1, false},
		{"empty array on append", `[]`, false, "", 0, true},
		{"empty array on create", `[]`, true, "", 0, false},
		{"invalid", `{"a":`, false, "", 0, true},
		{"string with newline escape", `"a\nb"`, false, "\"a\\nb\"\n", 1, false},
		{"utf-8 in a string", `{"k":"héllo ☃"}`, false, "{\"k\":\"héllo ☃\"}\n", 1, false},
		{"invalid utf-8 in a string", "{\"k\":\"\xff\"}", false, "", 0, true},
		{"invalid utf-8 in a key", "{\"\xc3\":1}", false, "", 0, true},
		{"overlong utf-8", "\"\xc0\xaf\"", false, "", 0, true},
		{"encoded surrogate", "\"\xed\xa0\x80\"", false, "", 0, true},
		{"invalid utf-8 in an array element", "[1,\"\xfe\"]", false, "", 0, true},
		{"escaped pair", `"\ud83d\ude00"`, false, "\"\\ud83d\\ude00\"\n", 1, false},
		{"escaped lone high surrogate", `"\ud83d"`, false, "", 0, true},
		{"escaped lone high surrogate then text", `"\ud83dxxxxxx"`, false, "", 0, true},
		{"escaped high then non-surrogate escape", `"\ud83d\u0041"`, false, "", 0, true},
		{"escaped lone low surrogate", `["\ude00"]`, false, "", 0, true},
		{"escaped backslash before u", `"\\ud83d"`, false, "\"\\\\ud83d\"\n", 1, false},
		{"escaped quote", `"a\"\ud800"`, false, "", 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, n, err := FlattenJSON([]byte(tc.in), tc.allowEmpty)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v", err)
			}
			if err == nil && (string(got) != tc.want || n != tc.n) {
				t.Fatalf("got %q (%d), want %q (%d)", got, n, tc.want, tc.n)
			}
		})
	}
}

func FuzzFlattenJSON(f *testing.F) {
	for _, s := range []string{`{}`, `[]`, `[1,[2]]`, `"x"`, `{"a":"\n"}`, `[`, ``, `null`, "\"\xff\"", `"\ud800"`, `"\ud800\udc00"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		out, n, err := FlattenJSON(body, true)
		if err != nil {
			if out != nil || n != 0 {
				t.Fatal("an error must come with no output")
			}
			return
		}
		lines := bytes.Split(bytes.TrimSuffix(out, []byte("\n")), []byte("\n"))
		if n == 0 {
			return
		}
		if len(lines) != n {
			t.Fatalf("%d lines for %d messages", len(lines), n)
		}
		for _, l := range lines {
			if !json.Valid(l) || !utf8.Valid(l) {
				t.Fatalf("stored line %q is not valid JSON in UTF-8", l)
			}
		}
	})
}
