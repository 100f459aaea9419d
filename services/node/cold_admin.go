package node

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/ursula/ursula/services/coldgc"
	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/stream"
)

// purgeReclaimPasses bounds the GC passes one purge request runs before it
// answers with what is left (a later request goes on).
const purgeReclaimPasses = 64

// purgeReport is the completion report of DELETE /__ursula/purge/{bucket}.
// Only cold_gc_complete, no pending entry, bucket_prefix_absent and no
// error together prove the bucket is gone from the object store.
type purgeReport struct {
	Bucket                 string   `json:"bucket"`
	RemovedStreams         uint64   `json:"removed_streams"`
	GroupsWithStreams      []uint32 `json:"groups_with_streams"`
	ColdGCEntriesReclaimed uint64   `json:"cold_gc_entries_reclaimed"`
	ColdGCPendingEntries   uint64   `json:"cold_gc_pending_entries"`
	ColdGCComplete         bool     `json:"cold_gc_complete"`
	ColdGCError            *string  `json:"cold_gc_error"`
	BucketPrefixAbsent     bool     `json:"bucket_prefix_absent"`
}

// registerCold adds the cold-tier endpoints to the admin mux.
func (s *Server) registerCold(mux *http.ServeMux) {
	mux.HandleFunc("POST /__ursula/flush-cold/{bucket}/{stream...}", s.mutation(s.serveFlushCold))
	mux.HandleFunc("DELETE /__ursula/purge/{bucket}", s.mutation(s.servePurge))
}

// serveFlushCold flushes one stream's hot bytes now (on its leader).
func (s *Server) serveFlushCold(w http.ResponseWriter, r *http.Request) {
	k := stream.Key{Bucket: r.PathValue("bucket"), Stream: r.PathValue("stream")}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if err := s.eng.FlushCold(ctx, k); err != nil {
		writeDomainError(w, err)
		return
	}
	m, _ := s.eng.Machines()[s.eng.GroupOf(k)].Lookup(k)
	writeJSON(w, http.StatusOK, map[string]any{"bucket": k.Bucket, "stream": k.Stream, "cold_offset": stream.FormatOffset(m.ColdEnd), "next_offset": stream.FormatOffset(m.Tail)})
}

// servePurge erases a bucket in every group, reclaims its cold objects and
// proves its prefix empty. Idempotent: send it again until the report is
// complete.
func (s *Server) servePurge(w http.ResponseWriter, r *http.Request) {
	bucket := r.PathValue("bucket")
	rep, err := s.purge(r.Context(), bucket)
	if err != nil {
		writeDomainError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

func (s *Server) purge(ctx context.Context, bucket string) (*purgeReport, error) {
	first, err := s.eng.PurgeBucket(ctx, bucket)
	if err != nil {
		return nil, err
	}
	rep := &purgeReport{Bucket: bucket, RemovedStreams: first.Removed, GroupsWithStreams: first.GroupsWithStreams}
	if rep.GroupsWithStreams == nil {
		rep.GroupsWithStreams = []uint32{}
	}
	store := s.eng.ColdStore()
	fail := func(err error) (*purgeReport, error) {
		msg := err.Error()
		rep.ColdGCError = &msg
		return rep, nil
	}
	if store == nil {
		return fail(errors.New("no cold store is configured"))
	}
	worker, err := coldgc.New(coldgc.Config{Interval: time.Second}, s.ColdGCClient(), store, s.logger)
	if err != nil {
		return nil, err
	}
	for range purgeReclaimPasses {
		n, err := worker.Reclaim(ctx, bucket)
		if err != nil {
			return fail(err)
		}
		if n == 0 {
			break
		}
	}
	// The second replicated round proves every group's queue of the
	// bucket empty, linearized after the fence.
	second, err := s.eng.PurgeBucket(ctx, bucket)
	if err != nil {
		return nil, err
	}
	rep.RemovedStreams += second.Removed
	rep.ColdGCEntriesReclaimed = second.GCReclaimed
	rep.ColdGCPendingEntries = second.GCPending
	rep.ColdGCComplete = second.GCPending == 0
	if !rep.ColdGCComplete {
		return rep, nil
	}
	prefix := stream.BucketPrefix(bucket)
	if err := worker.DeletePrefix(ctx, prefix); err != nil {
		return fail(err)
	}
	absent := true
	if err := store.List(ctx, prefix, func(objstore.Info) error {
		absent = false
		return errStopList
	}); err != nil && !errors.Is(err, errStopList) {
		return fail(err)
	}
	rep.BucketPrefixAbsent = absent
	return rep, nil
}

var errStopList = errors.New("stop listing")

// writeDomainError answers an engine error on the admin plane: 503 with
// Retry-After while a group has no reachable leader, 409 naming the leader
// when this node does not lead, 400 or 404 for bad requests.
func writeDomainError(w http.ResponseWriter, err error) {
	var de *errcode.Error
	if !errors.As(err, &de) {
		writeJSON(w, http.StatusInternalServerError, map[string]any{"code": "INTERNAL", "message": err.Error()})
		return
	}
	status := http.StatusInternalServerError
	body := map[string]any{"code": de.Code, "message": de.Message}
	switch de.Code {
	case errcode.InvalidArgument:
		status = http.StatusBadRequest
	case errcode.StreamNotFound, errcode.BucketNotFound:
		status = http.StatusNotFound
	case errcode.NotLeader:
		status = http.StatusConflict
		if id, err := strconv.ParseUint(de.Metadata[errcode.KeyLeaderID], 10, 64); err == nil {
			body["leader_id"] = id
		}
	case errcode.Unavailable, errcode.Overloaded, errcode.OutcomeUnknown, errcode.ColdStoreFailed:
		status = http.StatusServiceUnavailable
		secs := int64(1)
		if ms, err := strconv.ParseInt(de.Metadata[errcode.KeyRetryAfterMS], 10, 64); err == nil && ms > 1000 {
			secs = (ms + 999) / 1000
		}
		w.Header().Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	writeJSON(w, status, body)
}
