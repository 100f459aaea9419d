package backup

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/ursula/ursula/storage/backupfmt"
)

// Manifest describes one complete backup (doc.go specifies the file).
type Manifest struct {
	FormatVersion uint32 `json:"format_version"`
	ID            string `json:"id"`
	ClusterID     string `json:"cluster_id"`
	GroupCount    uint32 `json:"group_count"`
	// SourceColdStore names the cold store the cold objects were copied
	// from (informational).
	SourceColdStore string        `json:"source_cold_store,omitempty"`
	CreatedAt       time.Time     `json:"created_at"`
	CompletedAt     time.Time     `json:"completed_at"`
	Groups          []GroupEntry  `json:"groups"`
	ColdObjects     []ColdObject  `json:"cold_objects"`
	Totals          ManifestTotal `json:"totals"`
}

// GroupEntry is one group's object in a backup.
type GroupEntry struct {
	Group uint32 `json:"group"`
	// Object is the group object's key in the location.
	Object string `json:"object"`
	Size   int64  `json:"size"`
	BLAKE3 string `json:"blake3"`
	// NodeID exported the group; CommitIndex and AppliedIndex are its
	// replica's when it did, HoldIndex the index of the cold-GC hold the
	// export waited for.
	NodeID       uint64    `json:"node_id"`
	CommitIndex  uint64    `json:"commit_index"`
	AppliedIndex uint64    `json:"applied_index"`
	HoldIndex    uint64    `json:"hold_index"`
	ExportedAt   time.Time `json:"exported_at"`
	// Streams counts the streams the group's snapshot holds.
	Streams int `json:"streams"`
	// ColdObjects counts the distinct cold objects the group references.
	ColdObjects int `json:"cold_objects"`
}

// ColdObject is one cold object the backup's groups reference.
type ColdObject struct {
	// Key is the object's key in the cluster's cold store (relative to its
	// root), which a restore copies it back to.
	Key string `json:"key"`
	// Object is its key in the location: objects/<2 hex>/<blake3>.
	Object string `json:"object"`
	Size   int64  `json:"size"`
	BLAKE3 string `json:"blake3"`
	// Check is the checksum the referencing snapshot carries for it
	// ("crc32c:xxxxxxxx", "sha256:<hex>" or empty), as backupfmt.Ref.Check.
	Check string `json:"check,omitempty"`
}

// ManifestTotal sums a backup up.
type ManifestTotal struct {
	Groups      int   `json:"groups"`
	GroupBytes  int64 `json:"group_bytes"`
	Streams     int   `json:"streams"`
	ColdObjects int   `json:"cold_objects"`
	ColdBytes   int64 `json:"cold_bytes"`
	// CopiedObjects and CopiedBytes were written into objects/ by this
	// backup; ReusedObjects and ReusedBytes were there already (an earlier
	// backup, or another key with the same content).
	CopiedObjects int64 `json:"copied_objects"`
	CopiedBytes   int64 `json:"copied_bytes"`
	ReusedObjects int64 `json:"reused_objects"`
	ReusedBytes   int64 `json:"reused_bytes"`
}

// refKey identifies a cold object's content as a snapshot references it:
// keys carry a nonce and objects are never rewritten, so key and check
// (and the size, when the reference carries one) name one content
// (backupfmt.Ref).
type refKey struct {
	key   string
	check string
}

// maxGroups bounds the group count a manifest may claim, so that a
// damaged one cannot make a reader allocate for billions of groups.
const maxGroups = 1 << 16

// encodeManifest renders a manifest as the file holds it.
func encodeManifest(m *Manifest) ([]byte, error) {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode the manifest: %w", err)
	}
	return append(b, '\n'), nil
}

// validate checks the manifest's own structure: the format version this
// build reads (ErrPrecondition), then one well-formed entry per group and
// per cold object (ErrCorrupt, the first problem).
func (m *Manifest) validate() error {
	if err := m.checkVersion(); err != nil {
		return err
	}
	if ps := m.problems(); len(ps) > 0 {
		return fmt.Errorf("%w: %s: %s", ErrCorrupt, ps[0].Object, ps[0].Detail)
	}
	return nil
}

func (m *Manifest) checkVersion() error {
	if m.FormatVersion != backupfmt.FormatVersion {
		return fmt.Errorf("%w: backup %s has format version %d, this build reads %d", ErrPrecondition, m.ID, m.FormatVersion, backupfmt.FormatVersion)
	}
	return nil
}

// problems lists what is wrong with the manifest's structure.
func (m *Manifest) problems() []Problem {
	mk := manifestKey(m.ID)
	var ps []Problem
	add := func(format string, args ...any) {
		ps = append(ps, Problem{Object: mk, Kind: ProblemManifest, Detail: fmt.Sprintf(format, args...)})
	}
	if m.GroupCount == 0 || m.GroupCount > maxGroups {
		add("group_count %d (want 1 to %d)", m.GroupCount, maxGroups)
		return ps
	}
	seen := make(map[uint32]bool, m.GroupCount)
	for _, g := range m.Groups {
		switch {
		case g.Group >= m.GroupCount:
			add("group %d of %d", g.Group, m.GroupCount)
			continue
		case seen[g.Group]:
			add("group %d is listed twice", g.Group)
			continue
		}
		seen[g.Group] = true
		if g.Object != groupKey(m.ID, int(g.Group)) || !backupfmt.ValidDigest(g.BLAKE3) || g.Size <= 0 {
			add("group %d's entry (object %q, size %d, blake3 %q) is malformed", g.Group, g.Object, g.Size, g.BLAKE3)
		}
	}
	for g := range m.GroupCount {
		if !seen[g] {
			add("group %d is missing", g)
		}
	}
	keys := make(map[string]bool, len(m.ColdObjects))
	for _, c := range m.ColdObjects {
		if c.Key == "" || keys[c.Key] {
			add("cold object key %q is empty or listed twice", c.Key)
			continue
		}
		keys[c.Key] = true
		if !backupfmt.ValidDigest(c.BLAKE3) || c.Object != objectKey(c.BLAKE3) || c.Size < 0 {
			add("cold object %s's entry (object %q, size %d, blake3 %q) is malformed", c.Key, c.Object, c.Size, c.BLAKE3)
		}
	}
	return ps
}
