// Package cold is a node's cold tier: it moves committed bytes from the
// groups' hot windows to the object store and reads them back.
//
//   - Flush: each group's leader looks every FlushInterval for streams past
//     FlushBytes, past FlushAge, holding external payloads, or (largest
//     first) while the group holds more than GroupFlushBytes; it packs the
//     oldest part of the hot window into chunk objects, seals full index
//     levels into page objects, uploads them, and proposes ColdFlush, whose
//     apply drops the bytes from every replica's hot window. A refused
//     flush deletes its objects.
//   - External payloads: an append of at least ExternalMinBytes is
//     uploaded as an object of its own before it is proposed.
//   - Backpressure: a write to a group holding HotCapBytes answers
//     OVERLOADED and wakes the flush loop.
//   - Reads of cold positions go through a block cache (package tier).
//   - Staged snapshot parts: objects under a stream's prefix, indexed in
//     memory by the leader per term (nothing replicated) until a commit
//     names them.
//   - The GC queue API the cold-GC worker drives: the replicated queue of
//     objects to delete, acknowledgements, compaction candidates and
//     swaps, live prefixes and references, bucket purges. Queue reads run
//     after a read barrier; commands are forwarded to the group's leader,
//     so the worker can talk to any node.
//
// The object formats are package coldfmt's. The tier reaches the groups
// only through Groups (package cluster implements it).
package cold
