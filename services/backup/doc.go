// Package backup writes, verifies, restores and prunes backups of an
// Ursula cluster, and runs them on a schedule (the ursula-backup binary;
// ursulactl calls the same functions). It reaches the nodes only through
// backupv1.BackupServiceClient values — gRPC on the client plane with the
// backup role, or anything else implementing the interface, such as
// ursulactl's client of the admin plane's REST mapping — and the object
// stores through storage/objstore; it imports no engine, state machine or
// Raft package, so it checks group objects with storage/backupfmt alone.
//
// # Location layout
//
// A location is an object store (s3://bucket/prefix, or a directory) that
// holds any number of backups of one or more clusters:
//
//	objects/<2 hex>/<blake3 hex>          cold objects, content-addressed
//	backups/<id>/groups/<group %05d>.bin  group objects (backupfmt)
//	backups/<id>/manifest.json            the manifest, written last
//	lock                                  the writers' lock
//	lock-takeover/<token>                 markers of expired locks taken over
//
// Cold objects are stored once under the hex BLAKE3-256 digest of their
// bytes (objects/ab/abcd…, the first two digits a directory), whoever
// references them, so backups are incremental: a backup copies only the
// objects no earlier backup holds. A backup exists, and is complete, when
// its manifest exists: a backup that failed leaves no manifest and stays
// invisible to List, Verify and Restore; Prune removes what it left.
//
// # Manifest
//
// backups/<id>/manifest.json is one JSON object (times in RFC 3339, UTC):
//
//	format_version     backupfmt.FormatVersion of the group objects
//	id                 the backup's id (one key segment: letters, digits,
//	                   '.', '_', '-'; by default the UTC start time,
//	                   20060102T150405Z)
//	cluster_id         the source cluster's id
//	group_count        its number of Raft groups, G
//	source_cold_store  the cold store the objects were copied from
//	created_at         when the backup started
//	completed_at       when its last object was written
//	groups             G entries, one per group 0..G-1:
//	  group            the group
//	  object           backups/<id>/groups/<group %05d>.bin
//	  size, blake3     the group object's length and hex BLAKE3-256 digest
//	  node_id          the node whose export it is
//	  commit_index     that node's commit index of the group then
//	  applied_index    the index its state machine had applied
//	  hold_index       the index of the cold-GC hold the export waited for
//	  exported_at      the node's clock at the export
//	  streams          streams in the group's snapshot
//	  cold_objects     distinct cold objects the group references
//	cold_objects       one entry per distinct cold key referenced, by key:
//	  key              the object's key in the cluster's cold store
//	  object           its key in the location, objects/<2 hex>/<blake3>
//	  size, blake3     its length and hex BLAKE3-256 digest
//	  check            the checksum the reference carries (backupfmt.Ref:
//	                   "crc32c:xxxxxxxx", "sha256:<hex>" or absent)
//	totals             groups, group_bytes, streams, cold_objects,
//	                   cold_bytes, and what this backup wrote
//	                   (copied_objects, copied_bytes) or found in
//	                   objects/ already (reused_objects, reused_bytes)
//
// Readers ignore fields they do not know; a manifest of another
// format_version is refused (ErrPrecondition).
//
// # Lock
//
// Writers (Create, Prune) take the lock object with PutIfAbsent; its body
// is JSON {id, token, host, pid, started, expires}: id names the
// operation (a backup id or "prune"), token is random per acquisition and
// is how the holder recognises its own lock. A lock lasts 10 minutes and
// its holder renews it every third of that; it checks the token first and
// stops its operation (ErrLocked) if the lock is no longer its own, and
// checks again before it writes a manifest. A lock whose expires has
// passed may be taken over: the taker wins PutIfAbsent of
// lock-takeover/<expired token> (only one can), checks that the lock
// still holds that token, and replaces it. The holder deletes the lock at
// the end, success or not. Readers (List, Verify, Restore) take no lock.
// The lock is advisory and relies on the writers' clocks agreeing within
// minutes; object stores offer no compare-and-swap of an existing object.
//
// # Create
//
//  1. GetBackupInfo from every node: those that answer must agree on
//     cluster id, group count and format version (this build's);
//     unreachable nodes are tolerated while every group can be exported.
//  2. The lock (above), and the map of cold objects the location's
//     complete backups hold, by cold key and check.
//  3. For each group, Concurrency at a time: HoldColdGC on its leader
//     (holder = the backup id, ttl = HoldTTL, renewed every third of it
//     while the group is copied, released with ttl 0 at the end), so that
//     no object an export references is deleted meanwhile; ExportGroup
//     from every node with min_applied_index = the hold's index, keeping
//     the answer with the highest commit index, then applied index, whose
//     digest checks out; the group object is decoded (it must be of the
//     cluster and group asked for) and written; its snapshot is walked
//     (backupfmt.Walk; index pages read from the source cold store, or
//     from the location when an earlier backup holds them, and verified
//     against their references), and each cold object it references is
//     copied: skipped without reading the source when an earlier manifest
//     maps the same key and check (and size, when the reference carries
//     one) to a digest whose object exists with that size;
//     otherwise read from the source cold store, checked against its
//     reference (size; a page's CRC or a chunk's footer and block CRCs; a
//     snapshot part's SHA-256), and written with PutIfAbsent under its
//     digest. At most Concurrency objects are copied at once.
//  4. The manifest, last, after the lock is proven still held.
//
// A failure anywhere stops the backup: no manifest is written, the holds
// and the lock are released, and the group objects already written are
// deleted (Prune removes the cold objects no manifest names).
//
// # Verify
//
// Verify reads only the location. DepthManifest: the manifest is of a
// known format version, lists each group 0..G-1 once and each cold key
// once with well-formed entries, and every listed object exists with its
// size. DepthObjects: and every object's BLAKE3 digest matches.
// DepthDeep: and every group object decodes and validates
// (backupfmt.DecodeGroup), is of the manifest's cluster, group and group
// count, and every cold object its snapshot references (walked with index
// pages read from objects/) is listed, with the same size and check.
//
// # Restore
//
//  1. The manifest (the newest complete one by default), checked as above.
//  2. GetBackupInfo from every node: every node must answer, and match
//     the backup's cluster id and group count and this build's format
//     version (ErrPrecondition otherwise; nothing is written).
//  3. The manifest's cold objects are copied into the target cluster's
//     cold store under their cold keys: a key the store holds with the
//     same size is skipped; every object read from the backup is checked
//     against its size and digest (ErrCorrupt names it).
//  4. ColdCheck of every group's object (on any node: they share one cold
//     store); any object missing stops the restore with ErrMissingCold
//     and nothing imported.
//  5. ImportGroup of every group's object (checked again against its
//     digest) on the group's leader: NOT_LEADER hints are followed among
//     the nodes known from step 2, UNAVAILABLE (and a lost outcome, since
//     an import is idempotent) retried with backoff until the context
//     ends. already=true counts as done, so a restore that stopped can run
//     again. A group that holds buckets refuses its import
//     (ErrPrecondition); it is found only by its own import, so groups
//     imported before it stay imported.
//
// # Prune
//
// Under the lock: removes the complete backups the retention does not
// keep (the KeepLast newest and those younger than KeepWithin stay, and
// always the newest), each manifest first; then the leftovers of failed
// backups; then every object in objects/ that no remaining manifest
// names. A manifest that does not decode stops it (its objects are
// unknown, so nothing could be collected safely).
//
// # Service
//
// Service runs Create on a schedule (an interval counted from the newest
// backup, or a cron expression) and Prune after each success, keeps
// counters (metrics.go) and answers GET /__ursula/ready and
// /__ursula/metrics on a loopback listener. A failed run is logged,
// counted and tried again at the next scheduled time; cancelling Run
// cancels a backup in flight, which releases its holds and lock and
// writes no manifest.
package backup
