// Package powerloss is a wal.FS for tests that simulates a host losing
// power: it wraps a real directory, keeps apart what was made durable and
// what was only written, and on PowerLoss rewrites the directory to what a
// disk would hold after the power came back.
//
// Test files anywhere in the module may import it; production code never
// does (the seam is engine.Deps.FS, multiraft.Config.FS, wal.Options.FS).
//
// # What is modelled
//
// File data. Each file remembers the bytes its last File.Sync made durable
// (the content, not only a length: a write after a Truncate may overwrite
// synced bytes in place). Everything written or truncated since is
// unsynced. Data durability belongs to the file, not to its name: a synced
// file renamed keeps its synced bytes under whichever name survives.
//
// Directory entries. Creating a file, renaming and removing one are
// durable only once the directory holding the entry was opened read-only
// and its handle Sync'd (wal.SyncDir; wal.WriteFileAtomic does it after its
// rename). Until then a power loss undoes them: a created file disappears,
// a renamed one is back under its old name (and the new name holds what it
// durably held before, if anything), a removed one reappears with its
// synced content. A rename across two directories is durable in each
// directory separately. The same holds for directories made by MkdirAll:
// their entry in the parent is durable only after a Sync of the parent,
// unless the loss is told otherwise (Loss.KeepNewDirs).
//
// The loss. PowerLoss first stops the world: every later call on the FS
// and on every File opened through it fails with ErrPowerLost (the process
// died with the host), and the real descriptors are closed. Then it
// rewrites the directory: every entry the FS knows is set back to its
// durable state and every file to its synced content. With Loss.Writeback
// a file keeps, in addition, a seeded random prefix of its unsynced bytes
// (page-cache writeback that got part of the way; where it overwrote bytes
// the file held durably, the prefix ends on a 512-byte sector boundary); with Loss.Tear the
// region after what was kept, up to the end of its 4 KiB sector (and no
// further than the file was written), reads as zeros or as seeded garbage
// (a sector written partially). Every choice comes from Loss.Seed and the
// file's path alone, so a failing run is replayed exactly with its seed
// (given the same writes). PowerLoss returns a Report of what each file
// lost.
//
// A restarted process gets a new FS over the same root (New): what exists
// under the root when an FS first looks at it is durable.
//
// # What is not modelled
//
//   - Anything done to the root's files behind the FS's back. Files the FS
//     never touched are left alone by a loss; a file changed directly (not
//     through the FS) after the FS looked at it confuses the model.
//   - Reordering of writes within a file beyond the model above: a loss
//     keeps a prefix of the unsynced bytes (in offset order, from the lowest
//     offset changed since the last Sync), followed by at most one torn
//     region. A disk that writes back later pages before earlier ones, or
//     tears several sectors, is not simulated.
//   - Durability that arrives earlier than asked: journaling file systems
//     often make a created or renamed entry durable with the next fsync of
//     any file, and may persist an entry before its file's data. The model
//     only ever undoes what was not synced, whole.
//   - Metadata other than entries and lengths: modes, times, extended
//     attributes. Restored files are written with mode 0644.
//   - Renaming or removing directories (refused with an error), hard links,
//     symbolic links, and files opened outside the root (refused).
//   - Failing I/O: a write or a Sync never fails before the loss. The FS
//     does not call fsync on the real files (the test process keeps its
//     power); it only records what a Sync made durable.
package powerloss
