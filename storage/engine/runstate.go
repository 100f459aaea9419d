package engine

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/ursula/ursula/storage/wal"
)

// The run state records whether the previous process shut down cleanly:
// a graceful shutdown writes raft-log/clean_shutdown after the journals are
// synced; a start removes it. A start that finds journals but no marker
// follows a crash (kill -9, OOM, power loss): under fsync "never" the
// unsynced tail of the journals may be gone, and metrics report
// wal_recovery so operators know.

func cleanShutdownFile(dataDir string) string {
	return filepath.Join(dataDir, "raft-log", "clean_shutdown")
}

// readRunState consumes the clean-shutdown marker and reports whether the
// previous run ended in a crash.
func readRunState(dataDir string, hadState bool) (crashed bool, err error) {
	path := cleanShutdownFile(dataDir)
	switch _, statErr := os.Stat(path); {
	case statErr == nil:
		if err := os.Remove(path); err != nil {
			return false, fmt.Errorf("engine: consume run state: %w", err)
		}
		return false, nil
	case errors.Is(statErr, os.ErrNotExist):
		return hadState, nil
	default:
		return false, fmt.Errorf("engine: read run state: %w", statErr)
	}
}

// recordCleanShutdown writes the marker; call it only after the journals
// were flushed and synced.
func recordCleanShutdown(dataDir string) error {
	path := cleanShutdownFile(dataDir)
	stamp := time.Now().UTC().Format(time.RFC3339Nano) + "\n"
	if err := wal.WriteFileAtomic(wal.OSFS{}, filepath.Dir(path), path, []byte(stamp)); err != nil {
		return fmt.Errorf("engine: record clean shutdown: %w", err)
	}
	return nil
}
