package engine

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"

	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/storage/cluster"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/tests/await"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mutate  func(*Config)
		wantErr string
	}{
		{"defaults", func(*Config) {}, ""},
		{"no data dir", func(c *Config) { c.DataDir = "" }, "raft.wal.path"},
		{"zero node id", func(c *Config) { c.NodeID = 0 }, "node_id"},
		{"no groups", func(c *Config) { c.GroupCount = 0 }, "group_count"},
		{"no shards", func(c *Config) { c.ShardCount = 0 }, "core_count"},
		{"bad fsync", func(c *Config) { c.Fsync = "sometimes" }, "raft.wal.fsync"},
		{"zero read chunk", func(c *Config) { c.ReadChunkBytes = 0 }, "read_chunk_bytes"},
		{"zero sweep", func(c *Config) { c.ExpirySweepInterval = 0 }, "intervals"},
		{"peers without self", func(c *Config) {
			c.Peers = []cluster.Peer{{ID: 2, ClusterURL: "a:1", ClientURL: "a:2"}, {ID: 3, ClusterURL: "b:1", ClientURL: "b:2"}}
		}, "does not include this node"},
		{"repeated peer", func(c *Config) {
			c.Peers = []cluster.Peer{{ID: 1, ClusterURL: "a:1", ClientURL: "a:2"}, {ID: 1, ClusterURL: "b:1", ClientURL: "b:2"}}
		}, "zero or repeated"},
		{"peer without urls", func(c *Config) { c.Peers = []cluster.Peer{{ID: 1}} }, "cluster_url"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig("/nonexistent")
			tc.mutate(&cfg)
			err := cfg.Validate()
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("Validate = %v, want an error mentioning %q", err, tc.wantErr)
			}
		})
	}
}

func TestCreateBucket(t *testing.T) {
	e := startEngine(t, nil)
	tests := []struct {
		name        string
		bucket      string
		wantCreated bool
		wantCode    *fault.Kind
	}{
		{"new bucket", "photos", true, nil},
		{"repeat is idempotent", "photos", false, nil},
		{"dots dashes underscores", "a.b-c_d", true, nil},
		{"empty", "", false, fault.ErrInvalidArgument},
		{"upper case", "Photos", false, fault.ErrInvalidArgument},
		{"leading dash", "-a", false, fault.ErrInvalidArgument},
		{"reserved prefix", "__ds", false, fault.ErrInvalidArgument},
		{"too long", strings.Repeat("a", 64), false, fault.ErrInvalidArgument},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := e.CreateBucket(t.Context(), &streamv1.CreateBucketRequest{Bucket: tc.bucket})
			wantCode(t, "CreateBucket", err, tc.wantCode)
			if err == nil && resp.GetCreated() != tc.wantCreated {
				t.Fatalf("created = %v, want %v", resp.GetCreated(), tc.wantCreated)
			}
		})
	}
}

func TestCreateStream(t *testing.T) {
	e := startEngine(t, nil)
	ttl := func(s uint64) *uint64 { return &s }
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("existing"), ContentType: "text/plain", TtlSeconds: ttl(60)})
	tests := []struct {
		name        string
		req         *streamv1.CreateStreamRequest
		wantCreated bool
		wantCode    *fault.Kind
		wantType    string
	}{
		{"default content type", &streamv1.CreateStreamRequest{Ref: ref("plain")}, true, nil, DefaultContentType},
		{"idempotent repeat", &streamv1.CreateStreamRequest{Ref: ref("plain")}, false, nil, DefaultContentType},
		{"same config, other parameters", &streamv1.CreateStreamRequest{Ref: ref("existing"), ContentType: "TEXT/plain; charset=utf-8", TtlSeconds: ttl(60)}, false, nil, "text/plain"},
		{"content type mismatch", &streamv1.CreateStreamRequest{Ref: ref("existing"), ContentType: "application/json", TtlSeconds: ttl(60)}, false, fault.ErrStreamExists, ""},
		{"ttl mismatch", &streamv1.CreateStreamRequest{Ref: ref("existing"), ContentType: "text/plain", TtlSeconds: ttl(61)}, false, fault.ErrStreamExists, ""},
		{"ttl dropped", &streamv1.CreateStreamRequest{Ref: ref("existing"), ContentType: "text/plain"}, false, fault.ErrStreamExists, ""},
		{"closed mismatch", &streamv1.CreateStreamRequest{Ref: ref("existing"), ContentType: "text/plain", TtlSeconds: ttl(60), Closed: true}, false, fault.ErrStreamExists, ""},
		{"unknown bucket", &streamv1.CreateStreamRequest{Ref: &streamv1.StreamRef{Bucket: "nope", Stream: "s"}}, false, fault.ErrBucketNotFound, ""},
		{"built-in bucket needs no creation", &streamv1.CreateStreamRequest{Ref: &streamv1.StreamRef{Bucket: "__ds", Stream: "s"}}, true, nil, DefaultContentType},
		{"empty stream id", &streamv1.CreateStreamRequest{Ref: ref("")}, false, fault.ErrInvalidArgument, ""},
		{"control character", &streamv1.CreateStreamRequest{Ref: ref("a\nb")}, false, fault.ErrInvalidArgument, ""},
		{"invalid utf-8", &streamv1.CreateStreamRequest{Ref: ref("a\xffb")}, false, fault.ErrInvalidArgument, ""},
		{"ttl and expires-at", &streamv1.CreateStreamRequest{Ref: ref("both"), TtlSeconds: ttl(5), ExpiresAt: "2030-01-01T00:00:00Z"}, false, fault.ErrInvalidArgument, ""},
		{"bad expires-at", &streamv1.CreateStreamRequest{Ref: ref("bad-at"), ExpiresAt: "tomorrow"}, false, fault.ErrInvalidArgument, ""},
		{"invalid json body", &streamv1.CreateStreamRequest{Ref: ref("badjson"), ContentType: "application/json", HasBody: true, Body: []byte("{")}, false, fault.ErrInvalidArgument, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := e.CreateStream(t.Context(), tc.req)
			wantCode(t, "CreateStream", err, tc.wantCode)
			if err != nil {
				return
			}
			if resp.GetCreated() != tc.wantCreated {
				t.Errorf("created = %v, want %v", resp.GetCreated(), tc.wantCreated)
			}
			if got := resp.GetInfo().GetContentType(); got != tc.wantType {
				t.Errorf("content type = %q, want %q", got, tc.wantType)
			}
		})
	}
	t.Run("failed creates left nothing behind", func(t *testing.T) {
		for _, name := range []string{"both", "bad-at", "badjson"} {
			if _, ok := e.machine(key(name)).Lookup(key(name)); ok {
				t.Errorf("stream %q exists after a failed create", name)
			}
		}
	})
}

func TestAppendValidation(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("s"), ContentType: "text/plain"})
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("closed"), ContentType: "text/plain", Closed: true})
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("j"), ContentType: "application/json"})
	tests := []struct {
		name     string
		req      *streamv1.AppendRequest
		wantCode *fault.Kind
	}{
		{"empty body", &streamv1.AppendRequest{Ref: ref("s"), ContentType: "text/plain"}, fault.ErrInvalidArgument},
		{"body without content type", &streamv1.AppendRequest{Ref: ref("s"), Body: []byte("x")}, fault.ErrInvalidArgument},
		{"content type mismatch", &streamv1.AppendRequest{Ref: ref("s"), ContentType: "application/json", Body: []byte("1")}, fault.ErrContentTypeMismatch},
		{"missing stream", &streamv1.AppendRequest{Ref: ref("nope"), ContentType: "text/plain", Body: []byte("x")}, fault.ErrStreamNotFound},
		{"closed stream", &streamv1.AppendRequest{Ref: ref("closed"), ContentType: "text/plain", Body: []byte("x")}, fault.ErrStreamClosed},
		{"closing a closed stream is idempotent", &streamv1.AppendRequest{Ref: ref("closed"), Close: true}, nil},
		{"empty producer id", &streamv1.AppendRequest{Ref: ref("s"), ContentType: "text/plain", Body: []byte("x"), Producer: &streamv1.Producer{}}, fault.ErrInvalidArgument},
		{"malformed json", &streamv1.AppendRequest{Ref: ref("j"), ContentType: "application/json", Body: []byte("{")}, fault.ErrInvalidArgument},
		{"malformed json with wrong type reports the type", &streamv1.AppendRequest{Ref: ref("j"), ContentType: "text/plain", Body: []byte("{")}, fault.ErrContentTypeMismatch},
		{"empty json array", &streamv1.AppendRequest{Ref: ref("j"), ContentType: "application/json", Body: []byte("[]")}, fault.ErrInvalidArgument},
		{"stream seq", &streamv1.AppendRequest{Ref: ref("s"), ContentType: "text/plain", Body: []byte("x"), StreamSeq: "b"}, nil},
		{"stream seq not increasing", &streamv1.AppendRequest{Ref: ref("s"), ContentType: "text/plain", Body: []byte("y"), StreamSeq: "a"}, fault.ErrStreamSeqConflict},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := e.Append(t.Context(), tc.req)
			wantCode(t, "Append", err, tc.wantCode)
		})
	}
	if got := readAll(t, e, "s"); got != "x" {
		t.Fatalf("stream s = %q after the table, want only the accepted append %q", got, "x")
	}
}

func TestJSONFlattening(t *testing.T) {
	e := startEngine(t, nil)
	const ct = "application/json; charset=utf-8"
	resp := mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("j"), ContentType: ct, HasBody: true, Body: []byte(` [ {"a": 1}, {"b": [1, 2]} ] `)})
	if got, want := resp.GetInfo().GetNextOffset(), off(uint64(len("{\"a\":1}\n{\"b\":[1,2]}\n"))); got != want {
		t.Fatalf("create next offset = %s, want %s", got, want)
	}
	steps := []struct {
		name string
		body string
		want string // stored form appended
	}{
		{"single value", `{ "c" : 3 }`, "{\"c\":3}\n"},
		{"array flattened one level", `[[1, 2], "x"]`, "[1,2]\n\"x\"\n"},
		{"scalar", ` 42 `, "42\n"},
		{"string with escaped newline stays one line", `"a\nb"`, "\"a\\nb\"\n"},
	}
	stored := "{\"a\":1}\n{\"b\":[1,2]}\n"
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			r := mustAppend(t, e, "j", ct, st.body)
			stored += st.want
			if got, want := r.GetNextOffset(), off(uint64(len(stored))); got != want {
				t.Fatalf("next offset = %s, want %s", got, want)
			}
			if got := readAll(t, e, "j"); got != stored {
				t.Fatalf("stored form = %q, want %q", got, stored)
			}
		})
	}
	t.Run("empty array create", func(t *testing.T) {
		r := mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("empty"), ContentType: "application/json", HasBody: true, Body: []byte("[]")})
		if r.GetInfo().GetNextOffset() != off(0) {
			t.Fatalf("next offset = %s, want 0", r.GetInfo().GetNextOffset())
		}
	})
}

func TestProducerDedupAcrossRestart(t *testing.T) {
	dir := t.TempDir()
	e := startEngineAt(t, testConfig(dir), nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("p"), ContentType: "text/plain"})
	appendAs := func(e *testEngine, epoch, seq uint64, body string) (*streamv1.AppendResponse, error) {
		return e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("p"), ContentType: "text/plain", Body: []byte(body),
			Producer: &streamv1.Producer{Id: "w1", Epoch: epoch, Seq: seq}})
	}
	// Enough writes to cross the snapshot threshold, so that the restart
	// recovers producer state from a snapshot and a WAL tail.
	var want strings.Builder
	for seq := range uint64(40) {
		if _, err := appendAs(e, 0, seq, "x"); err != nil {
			t.Fatalf("append seq %d: %v", seq, err)
		}
		want.WriteString("x")
	}
	// Snapshots are written in the background: wait for one to land.
	await.True(t, "a snapshot of the group", func() bool { return e.status(e.GroupOf(key("p"))).SnapshotIndex > 0 })
	e = restart(t, e, nil)
	tests := []struct {
		name     string
		epoch    uint64
		seq      uint64
		wantDup  bool
		wantCode *fault.Kind
	}{
		{"retry of the last write is a duplicate", 0, 39, true, nil},
		{"retry of an older write is a duplicate", 0, 3, true, nil},
		{"next sequence", 0, 40, false, nil},
		{"gap", 0, 42, false, fault.ErrProducerSeqGap},
		{"new epoch", 1, 0, false, nil},
		{"stale epoch", 0, 41, false, fault.ErrProducerStaleEpoch},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, err := appendAs(e, tc.epoch, tc.seq, "y")
			wantCode(t, "Append", err, tc.wantCode)
			if err != nil {
				return
			}
			if r.GetDuplicate() != tc.wantDup {
				t.Fatalf("duplicate = %v, want %v", r.GetDuplicate(), tc.wantDup)
			}
			if !tc.wantDup {
				want.WriteString("y")
			}
		})
	}
	if got := readAll(t, e, "p"); got != want.String() {
		t.Fatalf("stream = %q, want %q", got, want.String())
	}
	if st := e.status(e.GroupOf(key("p"))); st.SnapshotIndex == 0 {
		t.Errorf("group never snapshotted (status %+v): the restart did not exercise snapshot recovery", st)
	}
}

// TestReadyAfterReplay checks the readiness barrier: once WaitReady returns
// on a restarted engine, every write acknowledged before the restart is
// visible without waiting.
func TestReadyAfterReplay(t *testing.T) {
	dir := t.TempDir()
	e := startEngineAt(t, testConfig(dir), nil)
	names := []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"}
	for _, n := range names {
		mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref(n), ContentType: "text/plain"})
		for range 5 {
			mustAppend(t, e, n, "text/plain", n)
		}
	}
	e = restart(t, e, nil)
	for _, n := range names {
		t.Run(n, func(t *testing.T) {
			h, err := e.Head(t.Context(), &streamv1.HeadRequest{Ref: ref(n)})
			if err != nil {
				t.Fatalf("Head right after WaitReady: %v", err)
			}
			if got, want := h.GetInfo().GetNextOffset(), off(uint64(5*len(n))); got != want {
				t.Fatalf("next offset = %s, want %s", got, want)
			}
			if got := readAll(t, e, n); got != strings.Repeat(n, 5) {
				t.Fatalf("read = %q", got)
			}
		})
	}
	if !e.node.machines[bucketGroup].HasBucket(testBucket) {
		t.Fatal("bucket lost across the restart")
	}
}

func TestDeleteStream(t *testing.T) {
	e := startEngine(t, nil)
	mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("d"), ContentType: "text/plain", HasBody: true, Body: []byte("old")})
	old, err := e.Head(t.Context(), &streamv1.HeadRequest{Ref: ref("d")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.DeleteStream(t.Context(), &streamv1.DeleteStreamRequest{Ref: ref("d")}); err != nil {
		t.Fatalf("DeleteStream: %v", err)
	}
	tests := []struct {
		name string
		op   func() error
		want *fault.Kind
	}{
		{"head", func() error { _, err := e.Head(t.Context(), &streamv1.HeadRequest{Ref: ref("d")}); return err }, fault.ErrStreamNotFound},
		{"read", func() error { _, err := e.Read(t.Context(), &streamv1.ReadRequest{Ref: ref("d")}); return err }, fault.ErrStreamNotFound},
		{"append", func() error {
			_, err := e.Append(t.Context(), &streamv1.AppendRequest{Ref: ref("d"), ContentType: "text/plain", Body: []byte("x")})
			return err
		}, fault.ErrStreamNotFound},
		{"delete again", func() error {
			_, err := e.DeleteStream(t.Context(), &streamv1.DeleteStreamRequest{Ref: ref("d")})
			return err
		}, fault.ErrStreamNotFound},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { wantCode(t, tc.name, tc.op(), tc.want) })
	}
	t.Run("recreate is a new incarnation", func(t *testing.T) {
		r := mustCreate(t, e, &streamv1.CreateStreamRequest{Ref: ref("d"), ContentType: "application/json"})
		if !r.GetCreated() || r.GetInfo().GetIncarnation() <= old.GetInfo().GetIncarnation() {
			t.Fatalf("recreate: created %v incarnation %d (old %d)", r.GetCreated(), r.GetInfo().GetIncarnation(), old.GetInfo().GetIncarnation())
		}
		if got := readAll(t, e, "d"); got != "" {
			t.Fatalf("recreated stream holds %q", got)
		}
	})
}

// TestDeterministicSnapshots feeds two engines the same requests under the
// same frozen clock: every group's state machine must encode identically.
func TestDeterministicSnapshots(t *testing.T) {
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	ttl := uint64(3600)
	script := func(tb testing.TB, e *testEngine) {
		tb.Helper()
		ctx := tb.Context()
		for i := range 12 {
			name := "s" + string(rune('a'+i))
			ct := "text/plain"
			if i%3 == 0 {
				ct = "application/json"
			}
			req := &streamv1.CreateStreamRequest{Ref: ref(name), ContentType: ct}
			if i%4 == 1 {
				req.TtlSeconds = &ttl
			}
			mustCreate(tb, e, req)
			for j := range 3 {
				body := `{"i":` + string(rune('0'+j)) + `}`
				if ct == "text/plain" {
					body = strings.Repeat(name, j+1)
				}
				if _, err := e.Append(ctx, &streamv1.AppendRequest{Ref: ref(name), ContentType: ct, Body: []byte(body),
					Producer: &streamv1.Producer{Id: "p", Seq: uint64(j)}}); err != nil {
					tb.Fatalf("append: %v", err)
				}
			}
		}
		mustCreate(tb, e, &streamv1.CreateStreamRequest{Ref: ref("fork"), Fork: &streamv1.ForkSpec{Source: ref("sb"), Offset: off(2)}})
		if _, err := e.DeleteStream(ctx, &streamv1.DeleteStreamRequest{Ref: ref("sb")}); err != nil {
			tb.Fatal(err)
		}
		if _, err := e.DeleteStream(ctx, &streamv1.DeleteStreamRequest{Ref: ref("sc")}); err != nil {
			tb.Fatal(err)
		}
		if _, err := e.Append(ctx, &streamv1.AppendRequest{Ref: ref("sd"), Close: true}); err != nil {
			tb.Fatal(err)
		}
		// Reads at a frozen clock neither change nor persist anything.
		if _, err := e.Read(ctx, &streamv1.ReadRequest{Ref: ref("sb")}); codeOf(err) != fault.ErrStreamGone {
			tb.Fatalf("read of soft-deleted source: %v", err)
		}
		readAll(tb, e, "fork")
	}
	// The third engine runs a millisecond later: commands carry the
	// leader's clock, so its state must differ (the comparison can fail).
	var snaps [3][][]byte
	for i := range snaps {
		e := startEngine(t, newFakeClock(start.Add(time.Duration(i/2)*time.Millisecond)))
		script(t, e)
		for g, m := range e.node.machines {
			b, err := m.Snapshot()
			if err != nil {
				t.Fatalf("engine %d group %d: snapshot: %v", i, g, err)
			}
			snaps[i] = append(snaps[i], b)
		}
		e.stop(t)
	}
	differs := false
	for g := range snaps[0] {
		if !bytes.Equal(snaps[0][g], snaps[1][g]) {
			t.Errorf("group %d: snapshots differ (%d vs %d bytes)", g, len(snaps[0][g]), len(snaps[1][g]))
		}
		differs = differs || !bytes.Equal(snaps[0][g], snaps[2][g])
	}
	if !differs {
		t.Error("an engine with another clock produced identical snapshots: the comparison sees nothing")
	}
}

func TestParsePeers(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    []cluster.Peer
		wantErr string
	}{
		{"empty", "", nil, ""},
		{"two", "1/127.0.0.1:4439/127.0.0.1:4437, 2/[::1]:5439/[::1]:5437", []cluster.Peer{
			{ID: 1, ClusterURL: "127.0.0.1:4439", ClientURL: "127.0.0.1:4437"},
			{ID: 2, ClusterURL: "[::1]:5439", ClientURL: "[::1]:5437"},
		}, ""},
		{"missing client", "1/a:1", nil, "want <id>/<cluster_url>/<client_url>"},
		{"zero id", "0/a:1/a:2", nil, "positive integer"},
		{"bad id", "x/a:1/a:2", nil, "positive integer"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParsePeers(tc.in)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParsePeers(%q) = %v, want an error mentioning %q", tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil || !slices.Equal(got, tc.want) {
				t.Fatalf("ParsePeers(%q) = %v, %v, want %v", tc.in, got, err, tc.want)
			}
		})
	}
}
