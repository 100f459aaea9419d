package errcode

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	errorsv1 "github.com/ursula/ursula/proto/gen/go/ursula/errors/v1"
)

// grpcDoc is the callers' guide whose error table this package's contract
// must match.
var grpcDoc = filepath.Join("..", "..", "..", "docs", "grpc.md")

// docRow is one row of docs/grpc.md's reason table:
// | `REASON` | `GRPC_CODE` (n) | HTTP | metadata | the caller |
var docRow = regexp.MustCompile("^\\| `([A-Z_]+)` \\| `([A-Z_]+)` \\((\\d+)\\) \\| (\\d{3}) \\|")

// TestDocsListEveryReason: docs/grpc.md has one row for every reason of
// the contract, with its gRPC code (name and number) and HTTP status, and
// no row for a reason the contract lacks; it names every metadata key.
func TestDocsListEveryReason(t *testing.T) {
	raw, err := os.ReadFile(grpcDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	type row struct {
		grpcName string
		grpcNum  uint32
		http     int
	}
	rows := map[string]row{}
	for line := range strings.SplitSeq(doc, "\n") {
		m := docRow.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		if _, dup := rows[m[1]]; dup {
			t.Errorf("docs/grpc.md lists %s twice", m[1])
		}
		n, _ := strconv.ParseUint(m[3], 10, 32)
		h, _ := strconv.Atoi(m[4])
		rows[m[1]] = row{grpcName: m[2], grpcNum: uint32(n), http: h}
	}
	values := errorsv1.Code(0).Descriptor().Values()
	for i := 1; i < values.Len(); i++ {
		c := Code(values.Get(i).Number())
		reason := Reason(c)
		r, ok := rows[reason]
		if !ok {
			t.Errorf("docs/grpc.md has no row for %s (gRPC %d, HTTP %d)", reason, GRPCCode(c), HTTPStatus(c))
			continue
		}
		delete(rows, reason)
		if r.grpcNum != GRPCCode(c) || r.grpcName != grpcCodeName(GRPCCode(c)) || r.http != HTTPStatus(c) {
			t.Errorf("docs/grpc.md: %s is %s (%d), HTTP %d; the contract says %s (%d), HTTP %d",
				reason, r.grpcName, r.grpcNum, r.http, grpcCodeName(GRPCCode(c)), GRPCCode(c), HTTPStatus(c))
		}
	}
	for reason := range rows {
		t.Errorf("docs/grpc.md lists %s, which is not a reason of the contract", reason)
	}
	for _, key := range []string{KeyNextOffset, KeyClosed, KeyProducerEpoch, KeyProducerSeq, KeyExpectedSeq, KeyReceivedSeq,
		KeyLeaderID, KeyLeaderAddr, KeyRetryAfterMS, KeyIncarnation, KeyRecordNext, KeyProcessIncarnation, KeyProducerOutcome} {
		if !strings.Contains(doc, "`"+key+"`") {
			t.Errorf("docs/grpc.md does not name the metadata key %s", key)
		}
	}
}

// grpcCodeName is a gRPC code's canonical name (NOT_FOUND, UNAVAILABLE).
func grpcCodeName(n uint32) string {
	name := codes.Code(n).String() // "NotFound", "Unavailable", "Canceled"
	if name == "Canceled" {
		return "CANCELLED"
	}
	var b strings.Builder
	for i, r := range name {
		if i > 0 && r >= 'A' && r <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(r)
	}
	return strings.ToUpper(b.String())
}
