package engine

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/fault"
	"github.com/ursula/ursula/storage/stream"
)

// Bounds of the backup operations.
const (
	// MaxGCHoldTTL bounds one hold on a group's cold GC; a backup that
	// needs longer renews it.
	MaxGCHoldTTL = 7 * 24 * time.Hour
	// importEntryMargin is what the cluster plane wraps around one log
	// entry (the Raft message, the entry and the batch envelopes, the
	// proposal header): an import leaves it free below max_message_bytes,
	// so that its entry reaches every follower in one message.
	importEntryMargin = 64 << 10
	// defaultMaxMessageBytes is the cluster plane's message bound when the
	// configuration leaves it 0 (storage/transport's default).
	defaultMaxMessageBytes = 64 << 20
)

// ExportedGroup is one replica's export of a group.
type ExportedGroup struct {
	// Snapshot is the group's state-machine snapshot (stream.Machine's
	// deterministic encoding).
	Snapshot []byte
	// AppliedIndex is the index the snapshot holds; CommitIndex this
	// replica's Raft commit index when it was captured (at least
	// AppliedIndex).
	AppliedIndex, CommitIndex uint64
}

// ExportGroup captures this node's replica of group g once it applied at
// least minApplied (waiting, within ctx, for it to get there): a backup
// holds the group's cold GC on the leader, then exports any replica at or
// above the hold's index. A replica holding a recovery plan or behind the
// recovery gate answers UNAVAILABLE: its state may belong to a history the
// group is about to replace.
func (e *Engine) ExportGroup(ctx context.Context, g uint32, minApplied uint64) (ExportedGroup, error) {
	if err := e.checkGroup(g); err != nil {
		return ExportedGroup{}, err
	}
	if err := e.exportable(g); err != nil {
		return ExportedGroup{}, err
	}
	if minApplied > 0 {
		if err := e.groups.WaitApplied(ctx, g, minApplied); err != nil {
			if ctx.Err() != nil {
				return ExportedGroup{}, fault.Errorf(fault.ErrUnavailable, "this replica of group %d applied %d, not yet %d: retry, or export another replica",
					g, e.groups.Status(g).Applied, minApplied).With(fault.DetailRetryAfterMS, "1000")
			}
			return ExportedGroup{}, err
		}
		if err := e.exportable(g); err != nil {
			return ExportedGroup{}, err
		}
	}
	encode, applied := e.groups.Machine(g).CaptureSnapshotAt()
	commit := max(e.groups.Status(g).Commit, applied)
	data, err := encode(nil)
	if err != nil {
		return ExportedGroup{}, fault.Errorf(fault.ErrInternal, "encode the snapshot of group %d: %v", g, err)
	}
	return ExportedGroup{Snapshot: data, AppliedIndex: applied, CommitIndex: commit}, nil
}

// exportable refuses an export of a replica that may hold a history its
// group replaces.
func (e *Engine) exportable(g uint32) error {
	st := e.groups.Status(g)
	switch {
	case st.Recovery != nil:
		return fault.Errorf(fault.ErrUnavailable, "group %d holds a recovery plan (term %d): export another replica or retry once its new history applied", g, st.Recovery.Term).With(fault.DetailRetryAfterMS, "1000")
	case st.Gated:
		return fault.Errorf(fault.ErrUnavailable, "group %d is behind the recovery gate on this node: export another replica or retry", g).With(fault.DetailRetryAfterMS, "1000")
	}
	return nil
}

// HoldColdGC holds group g's cold GC for holder for ttl from now by the
// leader's clock (0 releases the hold; a second hold of the holder
// replaces the first) and returns the log index the hold applied at: an
// export at or above it references no object the GC may still delete
// while the hold lasts. It runs on the group's leader (NOT_LEADER names
// it otherwise).
func (e *Engine) HoldColdGC(ctx context.Context, g uint32, holder string, ttl time.Duration) (uint64, error) {
	if err := e.checkGroup(g); err != nil {
		return 0, err
	}
	if holder == "" || len(holder) > stream.MaxHolderBytes {
		return 0, fault.Errorf(fault.ErrInvalidArgument, "a GC holder is named by 1 to %d bytes", stream.MaxHolderBytes)
	}
	if err := validToken("the GC holder", holder); err != nil {
		return 0, err
	}
	if ttl < 0 || ttl > MaxGCHoldTTL {
		return 0, fault.Errorf(fault.ErrInvalidArgument, "a GC hold lasts 0 (release) to %s, not %s", MaxGCHoldTTL, ttl)
	}
	if !e.groups.Status(g).IsLeader {
		return 0, e.groups.NotLeader(g)
	}
	var until int64
	if ttl > 0 {
		until = e.nowMs() + max(ttl.Milliseconds(), 1)
	}
	res, err := e.propose(ctx, g, &storagev1.Command{Op: &storagev1.Command_HoldColdGc{HoldColdGc: &storagev1.HoldColdGC{Holder: holder, UntilMs: until}}})
	if err != nil {
		return 0, err
	}
	return res.Index, nil
}

// ImportResult is the outcome of an import.
type ImportResult struct {
	// Already: the group took this import before (same digest); nothing
	// changed, and Index and Streams are the first import's.
	Already bool
	// Index is the log index the import applied at.
	Index uint64
	// Streams counts the streams that took a new incarnation.
	Streams uint64
}

// MaxImportBytes is the largest ImportGroup command this node proposes:
// its entry must reach every follower in one cluster-plane message.
func (e *Engine) MaxImportBytes() int {
	limit := e.cfg.MaxMessageBytes
	if limit <= 0 {
		limit = defaultMaxMessageBytes
	}
	return limit - importEntryMargin
}

// ImportGroup replaces the state of group g, which must be empty, with a
// backup's snapshot of it (the snapshot bytes of a group object whose
// BLAKE3 digest is blake3), as one replicated entry that starts a new
// history of the group (package stream, "Backups"). A repeat of the
// import applied answers Already. It runs on the group's leader
// (NOT_LEADER names it otherwise). Refusals: GROUP_NOT_EMPTY (409), an
// invalid snapshot or digest (INVALID_ARGUMENT), a command above
// MaxImportBytes (PAYLOAD_TOO_LARGE); the node checks the group object
// around it (version, cluster, group count).
func (e *Engine) ImportGroup(ctx context.Context, g uint32, snapshot []byte, blake3 string) (ImportResult, error) {
	if err := e.checkGroup(g); err != nil {
		return ImportResult{}, err
	}
	if !backupfmt.ValidDigest(blake3) {
		return ImportResult{}, fault.Errorf(fault.ErrInvalidArgument, "an import names the group object's BLAKE3 digest (64 lower-case hex digits), not %q", blake3)
	}
	cmd := &storagev1.Command{Op: &storagev1.Command_ImportGroup{ImportGroup: &storagev1.ImportGroup{Snapshot: snapshot, Blake3: blake3}}}
	if n, limit := proto.Size(cmd), e.MaxImportBytes(); n > limit {
		return ImportResult{}, fault.Errorf(fault.ErrPayloadTooLarge,
			"the import of group %d is a %d-byte log entry; one entry carries at most %d bytes (max_message_bytes less %d): raise max_message_bytes on every node",
			g, n, limit, importEntryMargin)
	}
	// Checked here so that an import that cannot apply costs no log entry
	// of up to max_message_bytes; apply checks again.
	var snap storagev1.Snapshot
	if err := proto.Unmarshal(snapshot, &snap); err != nil {
		return ImportResult{}, fault.Errorf(fault.ErrInvalidArgument, "the imported snapshot does not decode: %v", err)
	}
	if err := backupfmt.ValidateSnapshot(&snap); err != nil {
		return ImportResult{}, fault.Errorf(fault.ErrInvalidArgument, "the imported snapshot is not valid: %v", err)
	}
	st := e.groups.Status(g)
	if !st.IsLeader {
		return ImportResult{}, e.groups.NotLeader(g)
	}
	if st.Applied < st.LeaderSince {
		// A new leader answers from a state that holds everything its
		// predecessors committed.
		if err := e.groups.WaitApplied(ctx, g, st.LeaderSince); err != nil {
			return ImportResult{}, err
		}
	}
	if rep, refused := e.groups.Machine(g).CheckImport(blake3); refused != nil {
		return ImportResult{}, refused
	} else if rep != nil {
		return ImportResult{Already: true, Index: rep.Index, Streams: rep.Streams}, nil
	}
	res, err := e.propose(ctx, g, cmd)
	if err != nil {
		return ImportResult{}, err
	}
	return ImportResult{Already: res.Duplicate, Index: res.EventIndex, Streams: res.Streams}, nil
}

// CheckImport tells how an import of the group object with digest blake3
// would apply on this node's replica of group g now: already applied
// (info), refused (the group holds data), or neither. The answer of a
// follower may lag; the import decides again on the leader.
func (e *Engine) CheckImport(g uint32, blake3 string) (*stream.ImportInfo, error) {
	if err := e.checkGroup(g); err != nil {
		return nil, err
	}
	info, refused := e.groups.Machine(g).CheckImport(blake3)
	if refused != nil {
		return nil, refused
	}
	return info, nil
}

// GCHeld reports whether a backup holds group g's cold GC on this node's
// replica (by this node's clock).
func (e *Engine) GCHeld(g uint32) bool {
	if int(g) >= e.groups.GroupCount() {
		return false
	}
	return e.groups.Machine(g).GCHeld(e.nowMs())
}

// Imported returns group g's import as this node's replica applied it; ok
// is false when the group never took one (or g is out of range).
func (e *Engine) Imported(g uint32) (stream.ImportInfo, bool) {
	if int(g) >= e.groups.GroupCount() {
		return stream.ImportInfo{}, false
	}
	return e.groups.Machine(g).Imported()
}

func (e *Engine) checkGroup(g uint32) error {
	if int(g) >= e.groups.GroupCount() {
		return fault.Errorf(fault.ErrInvalidArgument, "group %d out of range [0, %d)", g, e.groups.GroupCount())
	}
	return nil
}
