package chaos

import (
	"bytes"
	"fmt"
	"math"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Kind is the kind of a recorded operation.
type Kind uint8

const (
	// Append is an idempotent producer's append of one record, retried with
	// the same (id, epoch, seq) until it had a definite answer.
	Append Kind = iota
	// Read is one catch-up GET from a byte position.
	Read
)

// Outcome is what an operation's caller learned.
type Outcome uint8

const (
	// Acked is a 200 append: the record is at [End-len(record), End).
	Acked Outcome = iota
	// Duplicate is a 204 append: an earlier attempt of the same producer
	// tuple was applied, at an offset the answer does not say.
	Duplicate
	// Unknown is an append without a definite answer (errors, timeouts,
	// 503s until the producer gave up): applied at most once, or not.
	Unknown
	// Refused is an append the server definitely did not apply.
	Refused
	// Returned is a read that answered 200.
	Returned
)

func (o Outcome) String() string {
	return [...]string{"acked", "duplicate", "unknown", "refused", "returned"}[o]
}

// Input is an operation's request.
type Input struct {
	Kind Kind
	// Record is the appended bytes (Append). Records are unique in a run.
	Record string
	// From is the byte position a read starts at (Read).
	From uint64
}

// Output is an operation's answer.
type Output struct {
	Outcome Outcome
	// End is the byte position of Stream-Next-Offset (Acked, Returned).
	End uint64
	// DataLen and DataHash (HashBytes) stand for the bytes a read returned,
	// so that long runs do not keep every read's data.
	DataLen  uint64
	DataHash uint64
	// Records is the number of records a read returned (for display).
	Records int
	// UpToDate is Stream-Up-To-Date of a read.
	UpToDate bool
}

// ReadOutput describes a read that answered 200 with data.
func ReadOutput(end uint64, data []byte, upToDate bool) Output {
	return Output{
		Outcome:  Returned,
		End:      end,
		DataLen:  uint64(len(data)),
		DataHash: HashBytes(0, data),
		Records:  bytes.Count(data, []byte{'\n'}),
		UpToDate: upToDate,
	}
}

// hashBase is the base of the polynomial hash: P(b0..bn-1) = Σ bi·B^(n-1-i)
// mod 2^64. Appending is P(xy) = P(x)·B^len(y) + P(y), so the hash of any
// byte range follows from the hashes of two prefixes.
const hashBase = 1099511628211

// HashBytes extends the polynomial hash h of some bytes with b.
func HashBytes(h uint64, b []byte) uint64 {
	for _, c := range b {
		h = h*hashBase + uint64(c) + 1
	}
	return h
}

// powBase is hashBase^n mod 2^64.
func powBase(n uint64) uint64 {
	r, b := uint64(1), uint64(hashBase)
	for ; n > 0; n >>= 1 {
		if n&1 == 1 {
			r *= b
		}
		b *= b
	}
	return r
}

// logState is a model state: the stream as a persistent list of records,
// newest first. nil is the empty stream. States are never mutated.
type logState struct {
	prev   *logState
	record string
	end    uint64 // byte length of the stream through this record
	hash   uint64 // HashBytes of every byte of the stream through this record
}

func (s *logState) length() uint64 {
	if s == nil {
		return 0
	}
	return s.end
}

func (s *logState) digest() uint64 {
	if s == nil {
		return 0
	}
	return s.hash
}

func (s *logState) push(record string) *logState {
	return &logState{prev: s, record: record, end: s.length() + uint64(len(record)), hash: HashBytes(s.digest(), []byte(record))}
}

// at returns the state whose log ends at byte pos, and false when pos is
// not a record boundary of s.
func (s *logState) at(pos uint64) (*logState, bool) {
	n := s
	for n != nil && n.end > pos {
		n = n.prev
	}
	return n, n.length() == pos
}

// readMatches reports whether a read of s from byte from can have returned
// out: its data are exactly the bytes of s between from and out.End, both
// record boundaries, and an up-to-date read ends at the tail of s.
func (s *logState) readMatches(from uint64, out Output) bool {
	if out.End > s.length() || (out.UpToDate && out.End != s.length()) {
		return false
	}
	if out.End < from || out.DataLen != out.End-from {
		return false
	}
	end, ok := s.at(out.End)
	if !ok {
		return false
	}
	start, ok := end.at(from)
	if !ok {
		return false
	}
	return end.digest()-start.digest()*powBase(out.End-from) == out.DataHash
}

// Model is the sequential specification of one stream: an append-only byte
// log of unique records. An acknowledged append lands exactly at the end of
// the log, at the offset its answer names; a duplicate answer means the
// record is in the log; an append of unknown outcome is in the log at most
// once, or not at all; a read returns exactly the log's bytes between its
// start and its Stream-Next-Offset, and the whole rest of the log when it
// says it is up to date. Linearizability against this model is what the
// chaos test checks per stream.
func Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Init: func() []any { return []any{(*logState)(nil)} },
		Step: func(state, input, output any) []any {
			s := state.(*logState)
			in, out := input.(Input), output.(Output)
			switch in.Kind {
			case Append:
				switch out.Outcome {
				case Acked:
					if s.length()+uint64(len(in.Record)) != out.End {
						return nil
					}
					return []any{s.push(in.Record)}
				case Duplicate:
					return []any{s.push(in.Record)}
				case Unknown:
					return []any{s, s.push(in.Record)}
				case Refused:
					return []any{s}
				}
			case Read:
				if out.Outcome == Returned && s.readMatches(in.From, out) {
					return []any{s}
				}
			}
			return nil
		},
		Equal: func(a, b any) bool {
			x, y := a.(*logState), b.(*logState)
			return x == y || (x.length() == y.length() && x.digest() == y.digest())
		},
		Hash: func(state any) uint64 { return state.(*logState).digest() },
		DescribeOperation: func(input, output any) string {
			in, out := input.(Input), output.(Output)
			if in.Kind == Read {
				up := ""
				if out.UpToDate {
					up = ", up to date"
				}
				return fmt.Sprintf("read [%d, %d)%s: %d records", in.From, out.End, up, out.Records)
			}
			rec := strings.TrimSuffix(in.Record, "\n")
			if i := strings.LastIndexByte(rec, '.'); i > 0 {
				rec = rec[:i]
			}
			switch out.Outcome {
			case Acked:
				return fmt.Sprintf("append %s -> [%d, %d)", rec, out.End-uint64(len(in.Record)), out.End)
			default:
				return fmt.Sprintf("append %s -> %v", rec, out.Outcome)
			}
		},
		DescribeState: func(state any) string {
			s := state.(*logState)
			n := 0
			for p := s; p != nil; p = p.prev {
				n++
			}
			return fmt.Sprintf("%d records, %d bytes", n, s.length())
		},
	}
	return nm.ToModel()
}

// History records the operations of a run, per stream, with invoke and
// return times on one monotonic clock, and the faults injected (as
// annotations for the visualization).
type History struct {
	start time.Time

	mu     sync.Mutex
	ops    map[string][]porcupine.Operation
	faults []porcupine.Annotation
}

// NewHistory starts a history; its clock starts now.
func NewHistory() *History {
	return &History{start: time.Now(), ops: map[string][]porcupine.Operation{}}
}

// Now is the history's clock, in nanoseconds since it started.
func (h *History) Now() int64 { return int64(time.Since(h.start)) }

// Add records one operation on stream by client. An Unknown append is
// recorded as never returning: it may take effect at any point after its
// call.
func (h *History) Add(stream string, client int, in Input, call int64, out Output, ret int64) {
	if in.Kind == Append && out.Outcome == Unknown {
		ret = math.MaxInt64 / 2
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ops[stream] = append(h.ops[stream], porcupine.Operation{
		ClientId: client, Input: in, Call: call, Output: out, Return: ret,
	})
}

// Fault records a fault injected between start and end.
func (h *History) Fault(desc string, start, end int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.faults = append(h.faults, porcupine.Annotation{
		Tag: "faults", Start: start, End: end, Description: desc, BackgroundColor: "#ffd7d7",
	})
}

// Streams returns the streams with recorded operations, sorted.
func (h *History) Streams() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.ops))
	for s := range h.ops {
		out = append(out, s)
	}
	sort.Strings(out)
	return out
}

// Ops returns the operations recorded on stream.
func (h *History) Ops(stream string) []porcupine.Operation {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]porcupine.Operation(nil), h.ops[stream]...)
}

// Check checks stream's history against Model within timeout. On Illegal
// it also writes porcupine's visualization, with the faults, to visPath
// (when not empty).
func (h *History) Check(stream string, timeout time.Duration, visPath string) (porcupine.CheckResult, error) {
	ops := h.Ops(stream)
	model := Model()
	res := porcupine.CheckOperationsTimeout(model, ops, timeout)
	if res != porcupine.Illegal || visPath == "" {
		return res, nil
	}
	_, info := porcupine.CheckOperationsVerbose(model, ops, timeout)
	h.mu.Lock()
	info.AddAnnotations(h.faults)
	h.mu.Unlock()
	return res, porcupine.VisualizePath(model, info, visPath)
}

// Counts summarises stream's history by outcome.
func (h *History) Counts(stream string) map[Outcome]int {
	counts := map[Outcome]int{}
	for _, op := range h.Ops(stream) {
		counts[op.Output.(Output).Outcome]++
	}
	return counts
}
