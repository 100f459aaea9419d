package statuspage

// Sample is the cluster's throughput and latency over one polling interval,
// summed over the nodes that answered both this read and the one before.
type Sample struct {
	// At is the end of the interval (Unix milliseconds).
	At int64 `json:"at"`
	// AppendsPerSec and AppendBytesPerSec are appends acknowledged by the
	// nodes; ReadsPerSec reads answered.
	AppendsPerSec     float64 `json:"appends_per_sec"`
	AppendBytesPerSec float64 `json:"append_bytes_per_sec"`
	ReadsPerSec       float64 `json:"reads_per_sec"`
	// AppendMs and ReadMs are the mean time a node spent in one append and
	// in one read that did not wait at the tail (a long-poll or a live
	// read is not timed) in the interval; 0 without any.
	AppendMs float64 `json:"append_ms"`
	ReadMs   float64 `json:"read_ms"`
	// Errors is append errors per second.
	ErrorsPerSec float64 `json:"errors_per_sec"`
}

// counters are one node's cumulative counters at one read.
type counters struct {
	incarnation                    string
	at                             int64
	appends, appendBytes, appendNs float64
	appendErrors                   float64
	reads, readNs, readsTimed      float64
}

func countersOf(m *NodeMetrics, at int64) counters {
	return counters{
		incarnation: m.ProcessIncarnation, at: at,
		appends: m.AppendRequests, appendBytes: m.AppendBytes, appendNs: m.AppendNs, appendErrors: m.AppendErrors,
		reads: m.ReadRequests, readNs: m.ReadNs, readsTimed: m.ReadImmediate,
	}
}

// rates turns the counters of the reachable nodes into one sample, given
// their previous values (by node id), and records the new ones in prev.
// A node whose process restarted (another incarnation) or that was not
// read before contributes nothing to this sample. ok is false when no
// node contributed.
func rates(cur map[uint64]counters, prev map[uint64]counters, at int64) (s Sample, ok bool) {
	var appends, bytes, appendNs, errs, reads, readNs, readsTimed float64
	n := 0
	for id, c := range cur {
		p, seen := prev[id]
		prev[id] = c
		if !seen || p.incarnation != c.incarnation || c.at <= p.at || c.appends < p.appends || c.reads < p.reads {
			continue
		}
		dt := float64(c.at-p.at) / 1000
		appends += (c.appends - p.appends) / dt
		bytes += (c.appendBytes - p.appendBytes) / dt
		errs += max(c.appendErrors-p.appendErrors, 0) / dt
		reads += (c.reads - p.reads) / dt
		appendNs += max(c.appendNs-p.appendNs, 0) / dt
		readNs += max(c.readNs-p.readNs, 0) / dt
		readsTimed += max(c.readsTimed-p.readsTimed, 0) / dt
		n++
	}
	for id := range prev {
		if _, ok := cur[id]; !ok {
			// A node that did not answer starts over when it does.
			delete(prev, id)
		}
	}
	if n == 0 {
		return Sample{}, false
	}
	s = Sample{At: at, AppendsPerSec: appends, AppendBytesPerSec: bytes, ReadsPerSec: reads, ErrorsPerSec: errs}
	if appends > 0 {
		s.AppendMs = appendNs / appends / 1e6
	}
	if readsTimed > 0 {
		s.ReadMs = readNs / readsTimed / 1e6
	}
	return s, true
}

// ring keeps the newest samples, at most its capacity.
type ring struct {
	buf   []Sample
	start int // index of the oldest sample
	n     int
}

func newRing(capacity int) *ring { return &ring{buf: make([]Sample, max(capacity, 1))} }

func (r *ring) add(s Sample) {
	if r.n < len(r.buf) {
		r.buf[(r.start+r.n)%len(r.buf)] = s
		r.n++
		return
	}
	r.buf[r.start] = s
	r.start = (r.start + 1) % len(r.buf)
}

// all returns the samples, oldest first, in a new slice.
func (r *ring) all() []Sample {
	out := make([]Sample, 0, r.n)
	for i := range r.n {
		out = append(out, r.buf[(r.start+i)%len(r.buf)])
	}
	return out
}
