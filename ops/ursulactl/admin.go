package ursulactl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// The thin verbs: one admin request each, with the node's incarnation
// pinned from one metrics read, the checks the metrics allow made before
// it, and a 503 with Retry-After sent again until Options.Timeout.

// groupOf checks that m reports group g.
func groupOf(id uint64, m *Metrics, g uint32) (*GroupMetrics, error) {
	gm := m.Group(g)
	if gm == nil {
		return nil, fmt.Errorf("node %d reports no group %d (it has %d groups)", id, g, len(m.Groups))
	}
	return gm, nil
}

// Snapshot asks node id for a Raft snapshot of group g (POST
// /__ursula/raft/{g}/snapshot) and returns the answer's body.
func (c *Controller) Snapshot(ctx context.Context, id uint64, g uint32) ([]byte, error) {
	p, m, err := c.pinNode(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	if _, err := groupOf(id, m, g); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	body, err := p.DoRetry(ctx, http.MethodPost, fmt.Sprintf("/__ursula/raft/%d/snapshot", g))
	if err != nil {
		return nil, fmt.Errorf("snapshot group %d on node %d: %w", g, id, err)
	}
	return body, nil
}

// PurgeLog asks node id to purge group g's log through index upto, at most
// through its last snapshot (POST /__ursula/raft/{g}/purge?upto=I).
func (c *Controller) PurgeLog(ctx context.Context, id uint64, g uint32, upto uint64) ([]byte, error) {
	p, m, err := c.pinNode(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("purge-log: %w", err)
	}
	if _, err := groupOf(id, m, g); err != nil {
		return nil, fmt.Errorf("purge-log: %w", err)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	body, err := p.DoRetry(ctx, http.MethodPost, fmt.Sprintf("/__ursula/raft/%d/purge?upto=%d", g, upto))
	if err != nil {
		return nil, fmt.Errorf("purge-log group %d on node %d: %w", g, id, err)
	}
	return body, nil
}

// Transfer hands group g's leadership from node id to node to (POST
// /__ursula/raft/{g}/leader/transfer/{to} on id) and waits until id no
// longer leads it. It aborts unless id leads g and to is an eligible
// voter: in the manifest, ready, not draining.
func (c *Controller) Transfer(ctx context.Context, id uint64, g uint32, to uint64) error {
	_, err := c.transfer(ctx, id, g, to)
	return err
}

// transfer is Transfer; it returns the group's new leader.
func (c *Controller) transfer(ctx context.Context, id uint64, g uint32, to uint64) (uint64, error) {
	if _, err := c.client(id); err != nil {
		return 0, err
	}
	views := c.observe(ctx)
	self := viewOf(views, id)
	if !self.Reachable() {
		return 0, fmt.Errorf("transfer: node %d unreachable: %w", id, self.Err)
	}
	gm, err := groupOf(id, self.Metrics, g)
	if err != nil {
		return 0, fmt.Errorf("transfer: %w", err)
	}
	if gm.LeaderID != id {
		return 0, abortf("node %d does not lead group %d (its leader is node %d); send the transfer to the leader", id, g, gm.LeaderID)
	}
	if to == id {
		return 0, abortf("node %d already leads group %d", id, g)
	}
	eligible, why := eligibleVoters(gm, id, views, c.shedStates(ctx, id), self.Metrics.ClusterID)
	if !slices.Contains(eligible, to) {
		reason := fmt.Sprintf("node %d is not a voter of group %d (voters %s)", to, g, joinIDs(gm.Voters))
		for _, w := range why {
			if strings.HasPrefix(w, fmt.Sprintf("node %d ", to)) || strings.HasPrefix(w, fmt.Sprintf("node %d:", to)) {
				reason = w
			}
		}
		return 0, abortf("node %d may not take group %d: %s", to, g, reason)
	}
	p, err := c.pin(ctx, id, self.Metrics)
	if err != nil {
		return 0, err
	}
	if _, err := p.Do(ctx, http.MethodPost, fmt.Sprintf("/__ursula/raft/%d/leader/transfer/%d", g, to)); err != nil {
		return 0, fmt.Errorf("transfer group %d from node %d to node %d: %w", g, id, to, err)
	}
	// A transfer the target cannot complete is abandoned by the leader
	// after about two election timeouts: do not wait much longer.
	ctx, cancel := context.WithTimeout(ctx, min(c.opts.Timeout, transferWait))
	defer cancel()
	prog := c.newProgress(fmt.Sprintf("group %d: transfer to node %d", g, to), false)
	defer prog.finish()
	for {
		m, err := c.clients[id].Metrics(ctx)
		if err != nil {
			prog.set(0, 0, fmt.Sprintf("group %d: transfer to node %d: metrics of node %d: %v", g, to, id, err))
		}
		if err == nil {
			if err := checkSameProcess(p, m); err != nil {
				return 0, err
			}
			if gm := m.Group(g); gm != nil && gm.LeaderID != id && gm.LeaderID != 0 {
				prog.finish()
				if gm.LeaderID != to {
					c.printf("group %d: leadership moved from node %d to node %d (asked for node %d)", g, id, gm.LeaderID, to)
				} else {
					c.printf("group %d: leadership moved from node %d to node %d", g, id, to)
				}
				return gm.LeaderID, nil
			}
			prog.set(0, 0, fmt.Sprintf("group %d: node %d still leads it; transfer to node %d asked", g, id, to))
		}
		if !c.sleep(ctx) {
			return 0, fmt.Errorf("transfer group %d: node %d still leads it after %v: the transfer did not complete (a target behind the leader's log is not handed leadership); try again", g, id, min(c.opts.Timeout, transferWait))
		}
	}
}

// Membership replaces group g's voter set on its leader, node id (POST
// /__ursula/raft/{g}/membership?voters=...). It aborts unless id leads g
// and every voter is a manifest node; a change that removes a voter is
// sent only once Options.Confirm confirms it.
func (c *Controller) Membership(ctx context.Context, id uint64, g uint32, voters []uint64) ([]byte, error) {
	if len(voters) == 0 {
		return nil, errors.New("membership: --voters lists no node")
	}
	for _, v := range voters {
		if !c.m.Has(v) {
			return nil, abortf("membership: voter %d is not in the manifest", v)
		}
	}
	p, m, err := c.pinNode(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("membership: %w", err)
	}
	gm, err := groupOf(id, m, g)
	if err != nil {
		return nil, fmt.Errorf("membership: %w", err)
	}
	if gm.LeaderID != id {
		return nil, abortf("node %d does not lead group %d (its leader is node %d); send the membership change to the leader", id, g, gm.LeaderID)
	}
	var removed []uint64
	for _, v := range gm.Voters {
		if !slices.Contains(voters, v) {
			removed = append(removed, v)
		}
	}
	if len(removed) > 0 {
		if err := c.confirm(ctx, Confirmation{
			Verb: "membership",
			Action: fmt.Sprintf("remove voters %s from group %d (voters %s now; the leader adds configured voters back as learners)",
				joinIDs(removed), g, joinIDs(gm.Voters)),
		}); err != nil {
			return nil, err
		}
	}
	ids := make([]string, len(voters))
	for i, v := range voters {
		ids[i] = strconv.FormatUint(v, 10)
	}
	body, err := p.Do(ctx, http.MethodPost, fmt.Sprintf("/__ursula/raft/%d/membership?voters=%s", g, strings.Join(ids, ",")))
	if err != nil {
		return nil, fmt.Errorf("membership of group %d on node %d: %w", g, id, err)
	}
	return body, nil
}

// FlushCold flushes one stream's hot bytes to the cold store now, on its
// group's leader (POST /__ursula/flush-cold/{bucket}/{stream}).
func (c *Controller) FlushCold(ctx context.Context, id uint64, bucket, stream string) ([]byte, error) {
	if bucket == "" || stream == "" {
		return nil, errors.New("flush-cold: --bucket and --stream are required")
	}
	p, _, err := c.pinNode(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("flush-cold: %w", err)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	path := "/__ursula/flush-cold/" + url.PathEscape(bucket) + "/" + escapeStream(stream)
	body, err := p.DoRetry(ctx, http.MethodPost, path)
	var se *StatusError
	if errors.As(err, &se) && se.Status == http.StatusConflict && se.LeaderID != 0 {
		return nil, fmt.Errorf("flush-cold %s/%s: node %d does not lead the stream's group; send it to node %d", bucket, stream, id, se.LeaderID)
	}
	if err != nil {
		return nil, fmt.Errorf("flush-cold %s/%s on node %d: %w", bucket, stream, id, err)
	}
	return body, nil
}

// escapeStream escapes each '/'-separated part of a stream name.
func escapeStream(s string) string {
	parts := strings.Split(s, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return strings.Join(parts, "/")
}

// PurgeReport is the answer of DELETE /__ursula/purge/{bucket}.
type PurgeReport struct {
	Bucket                 string   `json:"bucket"`
	RemovedStreams         uint64   `json:"removed_streams"`
	GroupsWithStreams      []uint32 `json:"groups_with_streams"`
	ColdGCEntriesReclaimed uint64   `json:"cold_gc_entries_reclaimed"`
	ColdGCPendingEntries   *uint64  `json:"cold_gc_pending_entries"`
	ColdGCComplete         bool     `json:"cold_gc_complete"`
	ColdGCError            *string  `json:"cold_gc_error"`
	BucketPrefixAbsent     bool     `json:"bucket_prefix_absent"`
}

// Complete reports whether the report proves the bucket gone: GC
// complete, no pending entry, no error, the prefix listed absent.
func (r *PurgeReport) Complete() bool {
	return r.ColdGCComplete && r.ColdGCPendingEntries != nil && *r.ColdGCPendingEntries == 0 &&
		r.ColdGCError == nil && r.BucketPrefixAbsent
}

// missing says what keeps the report from proving completion.
func (r *PurgeReport) missing() string {
	var why []string
	if !r.ColdGCComplete {
		why = append(why, "cold_gc_complete is false")
	}
	if r.ColdGCPendingEntries == nil {
		why = append(why, "no cold_gc_pending_entries")
	} else if *r.ColdGCPendingEntries != 0 {
		why = append(why, fmt.Sprintf("cold_gc_pending_entries is %d", *r.ColdGCPendingEntries))
	}
	if r.ColdGCError != nil {
		why = append(why, "cold_gc_error: "+*r.ColdGCError)
	}
	if !r.BucketPrefixAbsent {
		why = append(why, "bucket_prefix_absent is false")
	}
	return strings.Join(why, ", ")
}

// PurgeBucket erases a bucket for good (DELETE /__ursula/purge/{bucket}
// on node id) and returns the report's body. It fails unless the report
// proves completion; the request is idempotent, so send it again then.
func (c *Controller) PurgeBucket(ctx context.Context, id uint64, bucket string) ([]byte, error) {
	if bucket == "" {
		return nil, errors.New("purge-bucket: --bucket is required")
	}
	p, _, err := c.pinNode(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("purge-bucket: %w", err)
	}
	ctx, cancel := c.withTimeout(ctx)
	defer cancel()
	body, err := p.DoRetry(ctx, http.MethodDelete, "/__ursula/purge/"+url.PathEscape(bucket))
	if err != nil {
		return nil, fmt.Errorf("purge-bucket %s on node %d: %w", bucket, id, err)
	}
	var rep PurgeReport
	if err := json.Unmarshal(body, &rep); err != nil {
		return body, fmt.Errorf("purge-bucket %s: the report does not decode: %w", bucket, err)
	}
	if !rep.Complete() {
		return body, fmt.Errorf("purge-bucket %s: the report does not prove completion (%s); send the same request again", bucket, rep.missing())
	}
	return body, nil
}
