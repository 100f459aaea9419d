package cluster

import (
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/ursula/ursula/storage/wal"
)

// clusterIDFile binds the WAL to a cluster id.
func clusterIDFile(dataDir string) string { return filepath.Join(dataDir, "raft-log", "cluster_id") }

// BindWAL records the cluster id in the WAL at first start and refuses a
// WAL that holds another id.
func BindWAL(dataDir, id string) error {
	path := clusterIDFile(dataDir)
	raw, err := os.ReadFile(path)
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
	case errors.Is(err, os.ErrNotExist):
		body := fmt.Sprintf("ursula-cluster-id v1\n%s\n%s\n", id, strconv.FormatUint(uint64(crc32.ChecksumIEEE([]byte(id))), 16))
		if err := wal.WriteFileAtomic(wal.OSFS{}, filepath.Dir(path), path, []byte(body)); err != nil {
			return fmt.Errorf("cluster: record cluster id: %w", err)
		}
		return nil
	default:
		return fmt.Errorf("cluster: read cluster id: %w", err)
	}
}
