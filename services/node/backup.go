package node

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/coldfmt"
	"github.com/ursula/ursula/storage/engine"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/objstore"
)

// Bounds of the backup service.
const (
	// maxFirstMissing bounds the keys a cold check lists.
	maxFirstMissing = 20
	// coldCheckParallel bounds the Heads a cold check has in flight.
	coldCheckParallel = 8
	// grpcEnvelope is what a gRPC answer adds around a group object.
	grpcEnvelope = 1 << 10
	// exportWait bounds the wait of an export for its replica to apply
	// the index asked for (a caller's own deadline may be shorter).
	exportWait = time.Minute
)

// backupService serves BackupService (the backup service's and
// ursulactl's view of the node) on the client plane, for the backup role,
// and is the admin plane's /__ursula/backup/ routes underneath
// (backup_http.go). A thin adapter over the engine and the backup format.
type backupService struct {
	backupv1.UnimplementedBackupServiceServer
	n         *engine.Node
	clusterID string
	// maxMessage bounds a gRPC answer (server.max_message_bytes).
	maxMessage int
	now        func() time.Time
}

// locator is a cold store that can name itself (objstore's stores).
type locator interface {
	Location() (location, endpoint string)
}

func (s *backupService) GetBackupInfo(context.Context, *backupv1.GetBackupInfoRequest) (*backupv1.BackupInfo, error) {
	return s.info(), nil
}

// importOverhead is what the import command adds to a group object's
// snapshot, rounded up (the object's own header is smaller).
const importOverhead = 1 << 10

func (s *backupService) info() *backupv1.BackupInfo {
	info := &backupv1.BackupInfo{FormatVersion: backupfmt.FormatVersion, ClusterId: s.clusterID,
		GroupCount: uint32(s.n.Engine.GroupCount()), NodeId: s.n.Config().NodeID,
		// The import command wraps the object's snapshot with its digest
		// and clock: leave it room.
		MaxImportBytes: uint64(max(s.n.Engine.MaxImportBytes()-importOverhead, 0))}
	if l, ok := s.n.Cold.Store().(locator); ok {
		info.ColdStore, info.ColdEndpoint = l.Location()
	}
	return info
}

func (s *backupService) HoldColdGC(ctx context.Context, req *backupv1.HoldColdGCRequest) (*backupv1.HoldColdGCResponse, error) {
	index, err := s.hold(ctx, req.GetGroup(), req.GetHolder(), req.GetTtlMs())
	if err != nil {
		return nil, toStatus(err)
	}
	return &backupv1.HoldColdGCResponse{Index: index}, nil
}

func (s *backupService) hold(ctx context.Context, g uint32, holder string, ttlMs int64) (uint64, error) {
	if ttlMs < 0 || ttlMs > engine.MaxGCHoldTTL.Milliseconds() {
		return 0, fault.Errorf(fault.ErrInvalidArgument, "ttl_ms is 0 (release) to %d, not %d", engine.MaxGCHoldTTL.Milliseconds(), ttlMs)
	}
	return s.n.Engine.HoldColdGC(ctx, g, holder, time.Duration(ttlMs)*time.Millisecond)
}

func (s *backupService) ExportGroup(ctx context.Context, req *backupv1.ExportGroupRequest) (*backupv1.ExportGroupResponse, error) {
	out, err := s.export(ctx, req.GetGroup(), req.GetMinAppliedIndex())
	if err != nil {
		return nil, toStatus(err)
	}
	if n := len(out.GetObject()); n+grpcEnvelope > s.maxMessage {
		return nil, toStatus(fault.Errorf(fault.ErrPayloadTooLarge,
			"the object of group %d is %d bytes, above what one answer carries (max_message_bytes %d): export it on the admin plane (GET /__ursula/backup/group/%d/export)",
			req.GetGroup(), n, s.maxMessage, req.GetGroup()))
	}
	return out, nil
}

// export builds this replica's group object of group g.
func (s *backupService) export(ctx context.Context, g uint32, minApplied uint64) (*backupv1.ExportGroupResponse, error) {
	ctx, cancel := context.WithTimeout(ctx, exportWait)
	defer cancel()
	ex, err := s.n.Engine.ExportGroup(ctx, g, minApplied)
	if err != nil {
		return nil, err
	}
	node := s.n.Config().NodeID
	obj, err := backupfmt.EncodeGroup(&backupv1.GroupObject{
		FormatVersion: backupfmt.FormatVersion, ClusterId: s.clusterID, Group: g, GroupCount: uint32(s.n.Engine.GroupCount()),
		NodeId: node, CommitIndex: ex.CommitIndex, AppliedIndex: ex.AppliedIndex, ExportedMs: s.now().UnixMilli(), Snapshot: ex.Snapshot,
	})
	if err != nil {
		return nil, fault.Errorf(fault.ErrInternal, "encode the group object of group %d: %v", g, err)
	}
	return &backupv1.ExportGroupResponse{Object: obj, Blake3: backupfmt.Digest(obj), CommitIndex: ex.CommitIndex, AppliedIndex: ex.AppliedIndex, NodeId: node}, nil
}

func (s *backupService) ColdCheck(ctx context.Context, req *backupv1.ColdCheckRequest) (*backupv1.ColdCheckResponse, error) {
	out, err := s.coldCheck(ctx, req.GetGroup(), req.GetObject())
	if err != nil {
		return nil, toStatus(err)
	}
	return out, nil
}

// coldCheck lists the objects a group object references that this node's
// cold store lacks: absent, or of another size than the reference says.
// Pages are read from the store (and verified) to reach what they index;
// a page that is missing or fails its checksum counts as missing, and
// what it indexes is not reached. Without a cold store every object
// referenced is missing (and no page can be descended).
func (s *backupService) coldCheck(ctx context.Context, g uint32, object []byte) (*backupv1.ColdCheckResponse, error) {
	obj, snap, err := s.decode(object)
	if err != nil {
		return nil, err
	}
	if obj.GetGroup() != g {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "the object holds group %d, not %d", obj.GetGroup(), g)
	}
	store := s.n.Cold.Store()
	var refs []backupfmt.Ref
	unreadable := map[string]bool{} // pages that are missing or corrupt
	readPage := func(ctx context.Context, r *storagev1.ColdRef) ([]byte, error) {
		if store == nil {
			unreadable[r.GetKey()] = true
			return nil, backupfmt.ErrSkipPage
		}
		body, err := store.Get(ctx, r.GetKey())
		if err == nil {
			_, err = coldfmt.DecodePage(body, r.GetCrc32C())
		}
		switch {
		case err == nil:
			return body, nil
		case errors.Is(err, objstore.ErrNotFound) || errors.Is(err, coldfmt.ErrCorrupt):
			unreadable[r.GetKey()] = true
			return nil, fmt.Errorf("%w: %v", backupfmt.ErrSkipPage, err)
		default:
			return nil, err
		}
	}
	if err := backupfmt.Walk(ctx, snap, readPage, func(r backupfmt.Ref) error {
		refs = append(refs, r)
		return nil
	}); err != nil {
		return nil, fault.Errorf(fault.ErrColdStoreFailed, "walk the cold index of group %d: %v", g, err)
	}
	missing := make([]bool, len(refs))
	if store == nil {
		for i := range missing {
			missing[i] = true
		}
	} else if err := headAll(ctx, store, refs, missing); err != nil {
		return nil, err
	}
	out := &backupv1.ColdCheckResponse{Checked: uint64(len(refs)), FirstMissing: []string{}}
	switch info, err := s.n.Engine.CheckImport(g, backupfmt.Digest(object)); {
	case err != nil:
		out.ImportRefusal = err.Error()
	case info != nil:
		out.Imported = true
	}
	for i, r := range refs {
		if missing[i] || unreadable[r.Key] {
			out.Missing++
			if len(out.FirstMissing) < maxFirstMissing {
				out.FirstMissing = append(out.FirstMissing, r.Key)
			}
		}
	}
	return out, nil
}

// headAll marks the references whose object is absent from store or of
// another size, coldCheckParallel at a time.
func headAll(ctx context.Context, store objstore.Store, refs []backupfmt.Ref, missing []bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	next := make(chan int)
	for range coldCheckParallel {
		wg.Go(func() {
			for i := range next {
				in, err := store.Head(ctx, refs[i].Key)
				switch {
				case errors.Is(err, objstore.ErrNotFound):
					missing[i] = true
				case err != nil:
					mu.Lock()
					if first == nil {
						first = fault.Errorf(fault.ErrColdStoreFailed, "head %s: %v", refs[i].Key, err)
					}
					mu.Unlock()
					cancel()
				case refs[i].Size != 0 && uint64(in.Size) != refs[i].Size:
					missing[i] = true // another object than the one referenced
				}
			}
		})
	}
	for i := range refs {
		select {
		case next <- i:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
	if first != nil {
		return first
	}
	return ctx.Err()
}

func (s *backupService) ImportGroup(ctx context.Context, req *backupv1.ImportGroupRequest) (*backupv1.ImportGroupResponse, error) {
	out, err := s.importGroup(ctx, req.GetGroup(), req.GetObject(), req.GetBlake3())
	if err != nil {
		return nil, toStatus(err)
	}
	return out, nil
}

// importGroup checks a group object against its digest and this cluster
// (format version, cluster id, group count, group) and imports it.
func (s *backupService) importGroup(ctx context.Context, g uint32, object []byte, blake3 string) (*backupv1.ImportGroupResponse, error) {
	switch {
	case blake3 == "":
		return nil, fault.Errorf(fault.ErrInvalidArgument, "an import names the group object's BLAKE3 digest (x-ursula-backup-blake3 on the admin plane)")
	case !backupfmt.ValidDigest(blake3):
		return nil, fault.Errorf(fault.ErrInvalidArgument, "the BLAKE3 digest %q is not 64 lower-case hex digits", blake3)
	}
	if got := backupfmt.Digest(object); got != blake3 {
		return nil, fault.Errorf(fault.ErrInvalidArgument, "the group object's BLAKE3 digest is %s, not %s: it was damaged or is another object", got, blake3)
	}
	obj, snap, err := s.decode(object)
	if err != nil {
		return nil, err
	}
	switch groups := uint32(s.n.Engine.GroupCount()); {
	case obj.GetGroup() != g:
		return nil, fault.Errorf(fault.ErrInvalidArgument, "the object holds group %d, not %d", obj.GetGroup(), g)
	case obj.GetGroupCount() != groups:
		return nil, fault.Errorf(fault.ErrBackupMismatch, "the object comes from a cluster of %d groups, this one has %d: a restore needs the same group count", obj.GetGroupCount(), groups)
	case obj.GetClusterId() != s.clusterID:
		return nil, fault.Errorf(fault.ErrBackupMismatch, "the object comes from cluster %q, this is cluster %q: a restore runs on a cluster of the same id", obj.GetClusterId(), s.clusterID)
	case obj.GetAppliedIndex() != snap.GetAppliedIndex():
		return nil, fault.Errorf(fault.ErrInvalidArgument, "the object says applied index %d, its snapshot holds %d", obj.GetAppliedIndex(), snap.GetAppliedIndex())
	}
	res, err := s.n.Engine.ImportGroup(ctx, g, obj.GetSnapshot(), blake3)
	if err != nil {
		return nil, err
	}
	return &backupv1.ImportGroupResponse{Already: res.Already, Index: res.Index, Streams: res.Streams}, nil
}

// decode decodes a group object: another format version is
// BACKUP_MISMATCH, anything else wrong INVALID_ARGUMENT.
func (s *backupService) decode(object []byte) (*backupv1.GroupObject, *storagev1.Snapshot, error) {
	obj, snap, err := backupfmt.DecodeGroup(object)
	switch {
	case errors.Is(err, backupfmt.ErrVersion):
		return nil, nil, fault.Errorf(fault.ErrBackupMismatch, "%v", err)
	case err != nil:
		return nil, nil, fault.Errorf(fault.ErrInvalidArgument, "not a valid group object: %v", err)
	}
	return obj, snap, nil
}
