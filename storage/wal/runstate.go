package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// The run state: a graceful shutdown, once every journal is flushed,
// fsynced and closed, records in <logDir>/clean_shutdown the active
// segment of each shard and its length. A start that finds the record
// holds its journals to it: every segment must decode cleanly and each
// shard's newest segment must be the recorded one, exactly as long, since
// nothing could have torn a tail that was synced before the process
// exited. A start without the record follows a crash and may cut a torn
// tail (see Recovery in doc.go). The record is removed once every journal
// was recovered, before the first new write, so that a run that crashes
// leaves no record behind.

// CleanShutdownFile is the run-state record's name in the log directory.
const CleanShutdownFile = "clean_shutdown"

var cleanShutdownMagic = []byte("URSCLEAN")

// SegmentTail is a shard's active segment as a clean shutdown left it.
type SegmentTail struct {
	// Seq is the segment's sequence number (its file name).
	Seq uint64
	// Size is its length in bytes.
	Size int64
}

// CleanShutdown is the record of a clean shutdown: the active segment of
// every shard, by shard id.
type CleanShutdown struct {
	Tails map[int]SegmentTail
}

// ReadCleanShutdown reads the run-state record of logDir: nil when there is
// none (the previous run crashed, or there was none). A record that does
// not decode is ErrCorrupt: it was written atomically, so it is damage.
func ReadCleanShutdown(fsys FS, logDir string) (*CleanShutdown, error) {
	path := filepath.Join(logDir, CleanShutdownFile)
	b, err := ReadFile(fsys, path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("wal: read the run state: %w", err)
	}
	bad := func(why string) (*CleanShutdown, error) {
		return nil, fmt.Errorf("%w: %s is damaged: %s", ErrCorrupt, path, why)
	}
	if len(b) < 20 || !bytes.Equal(b[:8], cleanShutdownMagic) {
		return bad("no magic")
	}
	if crc32.Checksum(b[:len(b)-4], crcTable) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return bad("checksum mismatch")
	}
	if e := binary.LittleEndian.Uint32(b[8:]); e != FormatEpoch {
		return bad(fmt.Sprintf("format epoch %d, this build reads %d", e, FormatEpoch))
	}
	n := int(binary.LittleEndian.Uint32(b[12:]))
	if len(b) != 16+20*n+4 {
		return bad(fmt.Sprintf("%d bytes for %d shards", len(b), n))
	}
	cs := &CleanShutdown{Tails: make(map[int]SegmentTail, n)}
	for i := range n {
		r := b[16+20*i:]
		shard := int(binary.LittleEndian.Uint32(r))
		size := binary.LittleEndian.Uint64(r[12:])
		if _, dup := cs.Tails[shard]; dup || size > 1<<62 {
			return bad(fmt.Sprintf("shard %d listed twice or with an impossible size", shard))
		}
		cs.Tails[shard] = SegmentTail{Seq: binary.LittleEndian.Uint64(r[4:]), Size: int64(size)}
	}
	return cs, nil
}

// RecordCleanShutdown writes the run-state record (atomically). Call it
// only after every journal was closed without an error; tails are their
// Tail values.
func RecordCleanShutdown(fsys FS, logDir string, tails map[int]SegmentTail) error {
	shards := make([]int, 0, len(tails))
	for s := range tails {
		shards = append(shards, s)
	}
	slices.Sort(shards)
	b := append([]byte(nil), cleanShutdownMagic...)
	b = putU32(b, FormatEpoch)
	b = putU32(b, uint32(len(shards)))
	for _, s := range shards {
		b = putU32(b, uint32(s))
		b = putU64(b, tails[s].Seq)
		b = putU64(b, uint64(tails[s].Size))
	}
	b = putU32(b, crc32.Checksum(b, crcTable))
	if err := WriteFileAtomic(fsys, logDir, filepath.Join(logDir, CleanShutdownFile), b); err != nil {
		return fmt.Errorf("wal: record clean shutdown: %w", err)
	}
	return nil
}

// ConsumeCleanShutdown removes the run-state record (durably), so that a
// crash of the run about to start is recognized as one.
func ConsumeCleanShutdown(fsys FS, logDir string) error {
	if err := fsys.Remove(filepath.Join(logDir, CleanShutdownFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("wal: consume the run state: %w", err)
	}
	if err := SyncDir(fsys, logDir); err != nil {
		return fmt.Errorf("wal: consume the run state: %w", err)
	}
	return nil
}

// The running record: every start, once its journals are recovered and
// before their first new write, records in <logDir>/running the kernel's
// boot id. A start that finds no clean-shutdown record but a running record
// of the boot it runs in follows a crash of the process alone: the page
// cache kept every write the process made, so under fsync "never" nothing
// it acknowledged can be gone (the start still syncs the journals, which
// also reports a write-back error the kernel met meanwhile). A record of
// another boot, or none, means the host may have crashed in between.

// RunningFile is the running record's name in the log directory.
const RunningFile = "running"

var runningMagic = []byte("URSRUN01")

// bootIDPath is where Linux publishes a random id drawn at every boot.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// BootIDer is implemented by a file system that models its machine's
// boots (the power-loss model draws a new id per instance); the journals
// of any other FS live on this host, whose boot id Linux publishes.
type BootIDer interface {
	BootID() string
}

// BootID returns the id of the boot fsys lives in; "" when it cannot be
// told (then no crash counts as one of the process alone).
func BootID(fsys FS) string {
	if b, ok := fsys.(BootIDer); ok {
		return b.BootID()
	}
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// ReadRunning returns the boot id the running record names: "" when there
// is none or it does not decode (a torn record proves nothing).
func ReadRunning(fsys FS, logDir string) string {
	b, err := ReadFile(fsys, filepath.Join(logDir, RunningFile))
	if err != nil || len(b) < len(runningMagic)+4 || !bytes.Equal(b[:len(runningMagic)], runningMagic) {
		return ""
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, crcTable) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return ""
	}
	return string(body[len(runningMagic):])
}

// RecordRunning writes the running record (atomically) naming bootID, or
// removes it when bootID is "": a run whose boot cannot be told leaves no
// record a later start could take for its own.
func RecordRunning(fsys FS, logDir, bootID string) error {
	if bootID == "" {
		return ForgetRunning(fsys, logDir)
	}
	b := append(append([]byte(nil), runningMagic...), bootID...)
	b = putU32(b, crc32.Checksum(b, crcTable))
	if err := WriteFileAtomic(fsys, logDir, filepath.Join(logDir, RunningFile), b); err != nil {
		return fmt.Errorf("wal: record the running state: %w", err)
	}
	return nil
}

// ForgetRunning removes the running record (durably): a run that met a
// journal failure calls it before it stops, so that the next start does not
// trust a page cache that may have dropped what it failed to write.
func ForgetRunning(fsys FS, logDir string) error {
	if err := fsys.Remove(filepath.Join(logDir, RunningFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("wal: forget the running state: %w", err)
	}
	if err := SyncDir(fsys, logDir); err != nil {
		return fmt.Errorf("wal: forget the running state: %w", err)
	}
	return nil
}
