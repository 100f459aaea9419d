package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"path/filepath"
	"strings"
)

// ErrTopologyMismatch reports that the configured group or shard count differs
// from the one bound to the WAL.
var ErrTopologyMismatch = errors.New("wal: topology mismatch")

const (
	topologyFile = "topology.bin"
	topologySize = 24
)

var topologyMagic = []byte("URSTOPO\x00")

// firstRecord names a segment under logDir that holds bytes, or "".
func firstRecord(fsys FS, logDir string) (string, error) {
	entries, err := fsys.ReadDir(logDir)
	if err != nil {
		return "", fmt.Errorf("wal: list %s: %w", logDir, err)
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "shard-") {
			continue
		}
		dir := filepath.Join(logDir, e.Name())
		segs, err := fsys.ReadDir(dir)
		if err != nil {
			return "", fmt.Errorf("wal: list %s: %w", dir, err)
		}
		for _, sg := range segs {
			if !strings.HasSuffix(sg.Name(), ".wal") {
				continue
			}
			info, err := sg.Info()
			if err != nil {
				return "", fmt.Errorf("wal: stat %s: %w", sg.Name(), err)
			}
			if info.Size() > 0 {
				return filepath.Join(dir, sg.Name()), nil
			}
		}
	}
	return "", nil
}

// LogDir returns the journal directory under a node's data directory.
func LogDir(dataDir string) string { return filepath.Join(dataDir, "raft-log") }

// CheckTopology binds groups and shards to the WAL in logDir: it creates
// topology.bin if the directory holds none and no journal holds records,
// and otherwise refuses a different group or shard count. A missing
// topology.bin beside journals that hold records refuses too: the counts
// those records were written under are unknown, and recreating the file
// from the current flags could bind them to the wrong ones.
func CheckTopology(fsys FS, logDir string, groups, shards int) error {
	if err := MkdirDurable(fsys, logDir); err != nil {
		return fmt.Errorf("wal: create %s: %w", logDir, err)
	}
	path := filepath.Join(logDir, topologyFile)
	b, err := ReadFile(fsys, path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if seg, err := firstRecord(fsys, logDir); err != nil {
			return err
		} else if seg != "" {
			return fmt.Errorf("%w: %s is missing but %s holds records; restore topology.bin from a backup of this data directory, "+
				"or rejoin the node with an empty data directory", ErrCorrupt, path, seg)
		}
		buf := make([]byte, 0, topologySize)
		buf = append(buf, topologyMagic...)
		buf = binary.LittleEndian.AppendUint32(buf, FormatEpoch)
		buf = binary.LittleEndian.AppendUint32(buf, uint32(groups))
		buf = binary.LittleEndian.AppendUint32(buf, uint32(shards))
		buf = binary.LittleEndian.AppendUint32(buf, crc32.Checksum(buf, crcTable))
		if err := WriteFileAtomic(fsys, logDir, path, buf); err != nil {
			return fmt.Errorf("wal: write topology: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("wal: read topology: %w", err)
	}
	if len(b) != topologySize || !bytes.Equal(b[:8], topologyMagic) ||
		crc32.Checksum(b[:20], crcTable) != binary.LittleEndian.Uint32(b[20:]) {
		return fmt.Errorf("%w: %s is damaged", ErrCorrupt, path)
	}
	epoch := binary.LittleEndian.Uint32(b[8:])
	g := binary.LittleEndian.Uint32(b[12:])
	s := binary.LittleEndian.Uint32(b[16:])
	if epoch != FormatEpoch {
		return fmt.Errorf("%w: %s has format epoch %d, this build reads %d", ErrTopologyMismatch, path, epoch, FormatEpoch)
	}
	if int(g) != groups || int(s) != shards {
		return fmt.Errorf("%w: %s binds group_count=%d shard_count=%d but the configuration has group_count=%d shard_count=%d; "+
			"start with the original counts or use a new data directory", ErrTopologyMismatch, path, g, s, groups, shards)
	}
	return nil
}
