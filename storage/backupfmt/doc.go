// Package backupfmt is the backup format shared by the storage node (which
// exports and imports groups) and the backup service (which writes,
// verifies and restores backup sets): the group object that wraps one
// group's state-machine snapshot, its BLAKE3 digest, the walk over every
// cold object a snapshot references, and the structural validation of a
// snapshot. Like storage/coldfmt it does no I/O of its own and imports
// nothing of ours but the protobuf contracts and coldfmt, so that the
// backup service can check a backup as deeply as the node without
// importing the state machine.
package backupfmt
