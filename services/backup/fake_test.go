package backup

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/objstore"
)

// fakeCluster is the node side of BackupService for a whole cluster: the
// groups' snapshots (the source), their leaders, the holds and the
// imports (the target). Every node of it serves the same state, as the
// replicas of a healthy cluster would.
type fakeCluster struct {
	mu         sync.Mutex
	clusterID  string
	groupCount uint32
	version    uint32
	coldStore  string
	// maxImport is every node's max_import_bytes (0: none reported).
	maxImport uint64
	// snaps are the groups' state machines (source side).
	snaps map[uint32]*storagev1.Snapshot
	// leader of each group (node id); 0: no leader (UNAVAILABLE).
	leader map[uint32]uint64
	index  uint64
	// holds: group → holder → ttl of the latest call; holdCalls counts
	// the calls with a ttl, releases those with 0.
	holds     map[uint32]map[string]int64
	holdCalls map[uint32]int
	releases  map[uint32]int
	// target side: the imports applied, by group (digest), and the cold
	// store ColdCheck checks against.
	imported    map[uint32]string
	importCalls int
	failAfter   int // > 0: the import call after failAfter successful ones fails
	nonEmpty    map[uint32]bool
	coldTarget  objstore.Store
	coldChecks  int
	// noLeader counts calls that answer UNAVAILABLE (no leader) for a
	// group before its leader is known.
	noLeader map[uint32]int
	// exportGate, when set, is called at each export (tests block there).
	exportGate func(ctx context.Context, g uint32) error
	// holdSeen is signalled at every hold call.
	holdSeen chan uint32
}

func newFakeCluster(id string, groups uint32) *fakeCluster {
	c := &fakeCluster{
		clusterID: id, groupCount: groups, version: backupfmt.FormatVersion,
		snaps: map[uint32]*storagev1.Snapshot{}, leader: map[uint32]uint64{},
		holds: map[uint32]map[string]int64{}, holdCalls: map[uint32]int{}, releases: map[uint32]int{},
		imported: map[uint32]string{}, nonEmpty: map[uint32]bool{}, noLeader: map[uint32]int{},
	}
	for g := range groups {
		c.snaps[g] = &storagev1.Snapshot{Format: 2, AppliedIndex: 1000}
		c.leader[g] = 1
	}
	return c
}

// fakeNode is one node of a fakeCluster.
type fakeNode struct {
	c  *fakeCluster
	id uint64
	// commitLag lowers the commit index this node reports.
	commitLag uint64
	mu        sync.Mutex
	down      bool
	// infoOverride replaces fields of this node's BackupInfo.
	infoOverride func(*backupv1.BackupInfo)
	exports      int
}

var _ backupv1.BackupServiceClient = (*fakeNode)(nil)

// nodes returns n nodes with ids 1..n.
func (c *fakeCluster) nodes(n int) ([]*fakeNode, []backupv1.BackupServiceClient) {
	var fs []*fakeNode
	var cs []backupv1.BackupServiceClient
	for i := range n {
		f := &fakeNode{c: c, id: uint64(i + 1)}
		fs = append(fs, f)
		cs = append(cs, f)
	}
	return fs, cs
}

func unavailable() error {
	return status.Error(codes.Unavailable, "connection refused")
}

func (n *fakeNode) isDown() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.down
}

func (n *fakeNode) setDown(down bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down = down
}

// leads answers nil on the group's leader, NOT_LEADER naming the leader
// elsewhere, UNAVAILABLE without one. c.mu is held.
func (n *fakeNode) leads(g uint32) error {
	l := n.c.leader[g]
	if n.c.noLeader[g] > 0 {
		n.c.noLeader[g]--
		l = 0
	}
	switch {
	case l == 0:
		return grpcerr.ToStatus(errcode.New(errcode.Unavailable, "group %d has no leader", g))
	case l != n.id:
		return grpcerr.ToStatus(errcode.New(errcode.NotLeader, "not the leader of group %d", g).With(errcode.KeyLeaderID, strconv.FormatUint(l, 10)))
	}
	return nil
}

func (n *fakeNode) GetBackupInfo(context.Context, *backupv1.GetBackupInfoRequest, ...grpc.CallOption) (*backupv1.BackupInfo, error) {
	if n.isDown() {
		return nil, unavailable()
	}
	n.c.mu.Lock()
	info := &backupv1.BackupInfo{FormatVersion: n.c.version, ClusterId: n.c.clusterID, GroupCount: n.c.groupCount, NodeId: n.id, ColdStore: n.c.coldStore, MaxImportBytes: n.c.maxImport}
	n.c.mu.Unlock()
	if n.infoOverride != nil {
		n.infoOverride(info)
	}
	return info, nil
}

func (n *fakeNode) HoldColdGC(_ context.Context, in *backupv1.HoldColdGCRequest, _ ...grpc.CallOption) (*backupv1.HoldColdGCResponse, error) {
	if n.isDown() {
		return nil, unavailable()
	}
	c := n.c
	c.mu.Lock()
	if err := n.leads(in.GetGroup()); err != nil {
		c.mu.Unlock()
		return nil, err
	}
	c.index++
	if c.holds[in.GetGroup()] == nil {
		c.holds[in.GetGroup()] = map[string]int64{}
	}
	if in.GetTtlMs() == 0 {
		delete(c.holds[in.GetGroup()], in.GetHolder())
		c.releases[in.GetGroup()]++
	} else {
		c.holds[in.GetGroup()][in.GetHolder()] = in.GetTtlMs()
		c.holdCalls[in.GetGroup()]++
	}
	idx := c.index
	seen := c.holdSeen
	c.mu.Unlock()
	if seen != nil {
		select {
		case seen <- in.GetGroup():
		default:
		}
	}
	return &backupv1.HoldColdGCResponse{Index: idx}, nil
}

func (n *fakeNode) ExportGroup(ctx context.Context, in *backupv1.ExportGroupRequest, _ ...grpc.CallOption) (*backupv1.ExportGroupResponse, error) {
	if n.isDown() {
		return nil, unavailable()
	}
	c := n.c
	c.mu.Lock()
	gate := c.exportGate
	c.mu.Unlock()
	if gate != nil {
		if err := gate(ctx, in.GetGroup()); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	n.mu.Lock()
	n.exports++
	n.mu.Unlock()
	snap, ok := c.snaps[in.GetGroup()]
	if !ok {
		return nil, status.Errorf(codes.InvalidArgument, "no group %d", in.GetGroup())
	}
	// A machine's snapshot lists buckets and streams sorted by name.
	snap = proto.CloneOf(snap)
	slices.Sort(snap.Buckets)
	slices.SortFunc(snap.Streams, func(a, b *storagev1.StreamState) int {
		return cmp.Or(cmp.Compare(a.GetBucket(), b.GetBucket()), cmp.Compare(a.GetStream(), b.GetStream()))
	})
	raw, err := proto.MarshalOptions{Deterministic: true}.Marshal(snap)
	if err != nil {
		return nil, err
	}
	applied := max(c.index, in.GetMinAppliedIndex())
	commit := applied + 10 - n.commitLag
	obj, err := backupfmt.EncodeGroup(&backupv1.GroupObject{
		FormatVersion: c.version, ClusterId: c.clusterID, Group: in.GetGroup(), GroupCount: c.groupCount,
		NodeId: n.id, CommitIndex: commit, AppliedIndex: applied, ExportedMs: 1_700_000_000_000, Snapshot: raw,
	})
	if err != nil {
		return nil, err
	}
	return &backupv1.ExportGroupResponse{Object: obj, Blake3: backupfmt.Digest(obj), CommitIndex: commit, AppliedIndex: applied, NodeId: n.id}, nil
}

func (n *fakeNode) ColdCheck(ctx context.Context, in *backupv1.ColdCheckRequest, _ ...grpc.CallOption) (*backupv1.ColdCheckResponse, error) {
	if n.isDown() {
		return nil, unavailable()
	}
	_, snap, err := backupfmt.DecodeGroup(in.GetObject())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	n.c.mu.Lock()
	n.c.coldChecks++
	store := n.c.coldTarget
	resp := &backupv1.ColdCheckResponse{}
	switch g := in.GetGroup(); {
	case n.c.imported[g] == backupfmt.Digest(in.GetObject()):
		resp.Imported = true
	case n.c.nonEmpty[g]:
		resp.ImportRefusal = fmt.Sprintf("group %d holds 1 buckets: an import replaces the state of an empty group only", g)
	}
	n.c.mu.Unlock()
	readPage := func(ctx context.Context, r *storagev1.ColdRef) ([]byte, error) { return store.Get(ctx, r.GetKey()) }
	err = backupfmt.Walk(ctx, snap, readPage, func(r backupfmt.Ref) error {
		resp.Checked++
		if _, err := store.Head(ctx, r.Key); err != nil {
			resp.Missing++
			if len(resp.FirstMissing) < 20 {
				resp.FirstMissing = append(resp.FirstMissing, r.Key)
			}
		}
		return nil
	})
	// A missing page was counted; what it indexes cannot be walked.
	if err != nil && !errors.Is(err, objstore.ErrNotFound) {
		return nil, status.Error(codes.Internal, err.Error())
	}
	return resp, nil
}

func (n *fakeNode) ImportGroup(_ context.Context, in *backupv1.ImportGroupRequest, _ ...grpc.CallOption) (*backupv1.ImportGroupResponse, error) {
	if n.isDown() {
		return nil, unavailable()
	}
	c := n.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := n.leads(in.GetGroup()); err != nil {
		return nil, err
	}
	if backupfmt.Digest(in.GetObject()) != in.GetBlake3() {
		return nil, status.Error(codes.InvalidArgument, "digest mismatch")
	}
	g := in.GetGroup()
	if d, ok := c.imported[g]; ok && d == in.GetBlake3() {
		return &backupv1.ImportGroupResponse{Already: true, Index: 7}, nil
	}
	if c.nonEmpty[g] {
		return nil, status.Error(codes.FailedPrecondition, "GROUP_NOT_EMPTY: group holds buckets")
	}
	if c.failAfter > 0 && len(c.imported) >= c.failAfter {
		return nil, status.Error(codes.Internal, "injected failure")
	}
	c.importCalls++
	_, snap, err := backupfmt.DecodeGroup(in.GetObject())
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	c.imported[g] = in.GetBlake3()
	c.index++
	return &backupv1.ImportGroupResponse{Index: c.index, Streams: uint64(len(snap.GetStreams()))}, nil
}

// source is a source cluster's cold store and the streams written to it.
type source struct {
	tb    testing.TB
	store objstore.Store
}

// streamSpec describes a hand-made stream.
type streamSpec struct {
	bucket, name string
	// chunks is the number of chunks, the first sealed of which are
	// sealed into one level-1 page.
	chunks, sealed int
	external       bool
	appSnapshot    bool
	parts          int
}

// writeStream makes a stream's cold objects in the source store (real
// chunks, a real page, an external payload, an application snapshot and
// its parts) and returns its state as a snapshot holds it.
func (s *source) writeStream(sp streamSpec) *storagev1.StreamState {
	s.tb.Helper()
	ctx := context.Background()
	prefix := coldfmt.StreamPrefix(sp.bucket, sp.name, 1)
	put := func(key string, body []byte) {
		s.tb.Helper()
		if err := s.store.Put(ctx, key, body); err != nil {
			s.tb.Fatal(err)
		}
	}
	var refs []*storagev1.ColdRef
	pos := uint64(0)
	for i := range sp.chunks {
		data := fmt.Appendf(nil, "%s/%s chunk %d\n", sp.bucket, sp.name, i)
		end := pos + uint64(len(data))
		body, crc := coldfmt.EncodeChunk(pos, [][]byte{data}, []uint64{end})
		key := coldfmt.ChunkKey(prefix, pos, end)
		put(key, body)
		refs = append(refs, &storagev1.ColdRef{Start: pos, End: end, Key: key, Kind: storagev1.ColdKind_COLD_KIND_CHUNK, Size: uint64(len(body)), Records: 1, Crc32C: crc})
		pos = end
	}
	st := &storagev1.StreamState{Bucket: sp.bucket, Stream: sp.name, Incarnation: 1, ContentType: "application/octet-stream", ColdEnd: pos}
	var levels []*storagev1.ColdLevel
	if sp.sealed > 0 {
		sealed := refs[:sp.sealed]
		body, crc := coldfmt.EncodePage(sealed)
		key := coldfmt.PageKey(prefix, 1, sealed[0].GetStart(), sealed[len(sealed)-1].GetEnd())
		put(key, body)
		page := &storagev1.ColdRef{Start: sealed[0].GetStart(), End: sealed[len(sealed)-1].GetEnd(), Key: key, Kind: storagev1.ColdKind_COLD_KIND_PAGE,
			Size: uint64(len(body)), Records: uint32(len(sealed)), Level: 1, Crc32C: crc}
		levels = []*storagev1.ColdLevel{{Entries: refs[sp.sealed:]}, {Entries: []*storagev1.ColdRef{page}}}
	} else {
		levels = []*storagev1.ColdLevel{{Entries: refs}}
	}
	st.ColdIndex = levels
	if sp.external {
		data := fmt.Appendf(nil, "external payload of %s", sp.name)
		body, crc := coldfmt.EncodeChunk(pos, [][]byte{data}, nil)
		key := coldfmt.ExternalKey(prefix)
		put(key, body)
		st.HotExternal = []*storagev1.HotExternal{{Ref: &storagev1.ColdRef{Start: pos, End: pos + uint64(len(data)), Key: key,
			Kind: storagev1.ColdKind_COLD_KIND_EXTERNAL, Size: uint64(len(body)), Crc32C: crc}}}
	}
	if sp.appSnapshot {
		body := fmt.Appendf(nil, "application snapshot of %s", sp.name)
		key := coldfmt.SnapshotKey(prefix, pos, "d1")
		put(key, body)
		ref := &storagev1.SnapshotRef{Position: pos, Digest: "d1", ContentType: "application/json", Key: key, Size: uint64(len(body))}
		for p := range sp.parts {
			part := fmt.Appendf(nil, "part %d of %s", p+1, sp.name)
			pk := coldfmt.SnapshotPartKey(prefix, pos, uint32(p+1))
			put(pk, part)
			sum := sha256.Sum256(part)
			ref.PartKeys = append(ref.PartKeys, pk)
			ref.PartSizes = append(ref.PartSizes, uint64(len(part)))
			ref.PartDigests = append(ref.PartDigests, hex.EncodeToString(sum[:]))
		}
		st.Snapshot = ref
	}
	return st
}

// addStream adds a stream to group g of the cluster.
func (c *fakeCluster) addStream(g uint32, st *storagev1.StreamState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.snaps[g].Streams = append(c.snaps[g].Streams, st)
}
