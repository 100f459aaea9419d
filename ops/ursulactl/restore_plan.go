package ursulactl

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	"github.com/ursula/ursula/services/backup"
)

// RestorePlan is what a restore will do, bound to what it was computed
// from: the backup's manifest, and every target node's identity and
// process incarnation. Its proof is the SHA-256 of its canonical JSON,
// as for recover-group: restore --expect-proof applies only the plan the
// operator reviewed, and a node that restarted, another backup or another
// cold store changes the proof.
type RestorePlan struct {
	Backup         string            `json:"backup"`
	Location       string            `json:"location"`
	ManifestDigest string            `json:"manifest_sha256"`
	ClusterID      string            `json:"cluster_id"`
	GroupCount     uint32            `json:"group_count"`
	FormatVersion  uint32            `json:"format_version"`
	CreatedAt      string            `json:"created_at"`
	Streams        int               `json:"streams"`
	ColdObjects    int               `json:"cold_objects"`
	ColdBytes      int64             `json:"cold_bytes"`
	ColdStore      string            `json:"cold_store"`
	Nodes          []RestorePlanNode `json:"nodes"`
	Groups         []RestorePlanItem `json:"groups"`
	Proof          string            `json:"-"`
}

// RestorePlanNode is one target node as the plan found it.
type RestorePlanNode struct {
	ID                 uint64 `json:"id"`
	ProcessIncarnation string `json:"process_incarnation"`
}

// RestorePlanItem is one group object the plan imports.
type RestorePlanItem struct {
	Group  uint32 `json:"group"`
	Size   int64  `json:"size"`
	BLAKE3 string `json:"blake3"`
}

// planRestore computes the plan of restoring backup id from loc into the
// manifest's cluster; coldStore is the --cold-store given ("" for the one
// the nodes report).
func (c *Controller) planRestore(ctx context.Context, loc *backup.Location, id, coldStore string) (*RestorePlan, []backupv1.BackupServiceClient, error) {
	m, err := backup.ReadManifest(ctx, loc, id)
	if err != nil {
		return nil, nil, err
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, nil, err
	}
	sum := sha256.Sum256(raw)
	p := &RestorePlan{
		Backup: m.ID, Location: loc.String(), ManifestDigest: hex.EncodeToString(sum[:]), ClusterID: m.ClusterID,
		GroupCount: m.GroupCount, FormatVersion: m.FormatVersion, CreatedAt: m.CreatedAt.UTC().Format("2006-01-02T15:04:05Z"),
		Streams: m.Totals.Streams, ColdObjects: len(m.ColdObjects), ColdBytes: m.Totals.ColdBytes, ColdStore: coldStore,
	}
	for _, g := range m.Groups {
		p.Groups = append(p.Groups, RestorePlanItem{Group: g.Group, Size: g.Size, BLAKE3: g.BLAKE3})
	}
	var nodes []backupv1.BackupServiceClient
	for _, n := range c.m.Nodes {
		pin, _, err := c.pinNode(ctx, n.ID)
		if err != nil {
			return nil, nil, err
		}
		client := &adminBackupClient{p: pin}
		info, err := client.GetBackupInfo(ctx, &backupv1.GetBackupInfoRequest{})
		if err != nil {
			return nil, nil, fmt.Errorf("node %d: %w", n.ID, err)
		}
		if p.ColdStore == "" {
			p.ColdStore = info.GetColdStore()
		}
		p.Nodes = append(p.Nodes, RestorePlanNode{ID: n.ID, ProcessIncarnation: pin.Incarnation})
		nodes = append(nodes, client)
	}
	canon, err := json.Marshal(p)
	if err != nil {
		return nil, nil, err
	}
	proof := sha256.Sum256(canon)
	p.Proof = hex.EncodeToString(proof[:])
	for _, n := range nodes {
		n.(*adminBackupClient).proof = p.Proof
	}
	return p, nodes, nil
}

// printRestorePlan prints a plan: consequences first, then what it is
// bound to, the apply command and, last, its proof.
func printRestorePlan(w io.Writer, p *RestorePlan, manifest string) {
	var ids []string
	for _, n := range p.Nodes {
		ids = append(ids, fmt.Sprint(n.ID))
	}
	fmt.Fprintf(w, "consequences:\n")
	fmt.Fprintf(w, "  restores backup %s (cluster %s, created %s): %d groups, %d streams, %d cold objects (%s)\n",
		p.Backup, p.ClusterID, p.CreatedAt, p.GroupCount, p.Streams, p.ColdObjects, byteSize(p.ColdBytes))
	fmt.Fprintf(w, "  into the cluster of nodes %s, whose groups must all be empty; the cold objects go into %s\n", strings.Join(ids, ", "), p.ColdStore)
	fmt.Fprintf(w, "  every restored stream takes a new Stream-Incarnation (clients holding the old token get 412; HEAD names it)\n")
	fmt.Fprintf(w, "  every producer epoch in the backup is closed: producers claim a new epoch to write again\n")
	fmt.Fprintf(w, "  writes the source acknowledged after each group's export are not in the backup\n")
	fmt.Fprintf(w, "bindings:\n")
	fmt.Fprintf(w, "  location %s, manifest sha256 %s, format version %d\n", p.Location, p.ManifestDigest, p.FormatVersion)
	for _, n := range p.Nodes {
		fmt.Fprintf(w, "  node %d process incarnation %s\n", n.ID, n.ProcessIncarnation)
	}
	fmt.Fprintf(w, "apply:\n  ursulactl --manifest %s restore --location %s --backup %s --expect-proof %s\n", manifest, p.Location, p.Backup, p.Proof)
	fmt.Fprintf(w, "proof %s\n", p.Proof)
}
