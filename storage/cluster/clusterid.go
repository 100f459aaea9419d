package cluster

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ursula/ursula/storage/wal"
)

// clusterIDFile binds the WAL to a cluster id.
func clusterIDFile(dataDir string) string { return filepath.Join(dataDir, "raft-log", "cluster_id") }

// BindWAL records the cluster id in the WAL at first start and refuses a
// WAL that holds another id; fsys is the node's file system (nil: the
// operating system's).
func BindWAL(fsys wal.FS, dataDir, id string) error {
	if fsys == nil {
		fsys = wal.OSFS{}
	}
	path := clusterIDFile(dataDir)
	raw, err := wal.ReadFile(fsys, path)
	switch {
	case err == nil:
		lines := strings.Split(strings.TrimRight(string(raw), "\n"), "\n")
		if len(lines) != 3 || lines[0] != "ursula-cluster-id v1" {
			return fmt.Errorf("cluster: %s is damaged", path)
		}
		if sum := strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(lines[1]))), 16); sum != lines[2] {
			return fmt.Errorf("cluster: %s fails its checksum", path)
		}
		if lines[1] != id {
			return fmt.Errorf("cluster: the WAL in %s belongs to cluster %q, not the configured server.cluster_id %q; give this node an empty data directory to join %q", dataDir, lines[1], id, id)
		}
		return nil
	case errors.Is(err, fs.ErrNotExist):
		body := fmt.Sprintf("ursula-cluster-id v1\n%s\n%s\n", id, strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(id))), 16))
		if err := wal.WriteFileAtomic(fsys, filepath.Dir(path), path, []byte(body)); err != nil {
			return fmt.Errorf("cluster: record cluster id: %w", err)
		}
		return nil
	default:
		return fmt.Errorf("cluster: read cluster id: %w", err)
	}
}
