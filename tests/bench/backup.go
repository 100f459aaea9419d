package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ursula/ursula/ops/ursulactl"
	"github.com/ursula/ursula/tests/e2e"
)

// BackupResult is the backup workload: seconds per GiB of backup-create
// and restore for hot-only and cold-heavy data, and the append throughput
// of the multi-stream workload while backups run, against the same
// workload without.
type BackupResult struct {
	Sets []*BackupSet `json:"sets"`
	// AppendOpsIdle and AppendOpsDuringBackup are multi-stream appends/s
	// on one server, without and with backups running back to back.
	AppendOpsIdle         float64 `json:"append_ops_idle"`
	AppendOpsDuringBackup float64 `json:"append_ops_during_backup"`
	// AppendCostRatio is AppendOpsDuringBackup / AppendOpsIdle.
	AppendCostRatio   float64 `json:"append_cost_ratio"`
	BackupsDuringLoad int     `json:"backups_during_load"`
}

// BackupSet is one data set backed up and restored.
type BackupSet struct {
	Name             string  `json:"name"`
	StreamBytes      int64   `json:"stream_bytes"`
	CreateS          float64 `json:"create_s"`
	CreateSPerGiB    float64 `json:"create_s_per_gib"`
	RestoreS         float64 `json:"restore_s"`
	RestoreSPerGiB   float64 `json:"restore_s_per_gib"`
	ColdObjects      int     `json:"cold_objects"`
	GroupObjectBytes int64   `json:"group_object_bytes"`
	ColdBytes        int64   `json:"cold_bytes"`
}

// hotOnlyArgs keep every byte hot (nothing reaches the flush thresholds);
// coldHeavyArgs flush nearly everything into 1 MiB chunks at once.
var (
	hotOnlyArgs   = []string{"-storage.cold.flush_bytes=1073741824", "-storage.cold.flush_age=1h", "-storage.cold.group_flush_bytes=60000000", "-storage.cold.hot_cap_bytes=64000000"}
	coldHeavyArgs = []string{"-storage.cold.flush_bytes=262144", "-storage.cold.flush_age=10ms", "-storage.cold.group_flush_bytes=1048576", "-storage.cold.flush_interval=10ms"}
)

// backupWorkload measures backup and restore on the all-in-one binary with
// a local-directory cold store and a local-directory backup location.
func backupWorkload(ctx context.Context, c config, bin string, logf func(string, ...any)) (*BackupResult, error) {
	res := &BackupResult{}
	for _, set := range []struct {
		name string
		args []string
	}{{"hot-only", hotOnlyArgs}, {"cold-heavy", coldHeavyArgs}} {
		bs, err := backupSet(ctx, c, bin, set.name, set.args, logf)
		if err != nil {
			return res, fmt.Errorf("%s: %w", set.name, err)
		}
		res.Sets = append(res.Sets, bs)
	}
	if err := backupUnderLoad(ctx, c, bin, res, logf); err != nil {
		return res, err
	}
	return res, nil
}

// backupSet fills one server, backs it up, and restores the backup into a
// second, empty server.
func backupSet(ctx context.Context, c config, bin, name string, args []string, logf func(string, ...any)) (*BackupSet, error) {
	work, err := os.MkdirTemp("", "ursula-bench-backup-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	src, err := startBackupServer(ctx, bin, filepath.Join(work, "src"), args)
	if err != nil {
		return nil, err
	}
	defer src.Close()
	total, err := fill(ctx, src.URL(), c.backupBytes, logf)
	if err != nil {
		return nil, err
	}
	bs := &BackupSet{Name: name, StreamBytes: total}
	loc := filepath.Join(work, "backups")
	t0 := time.Now()
	out, err := ctl(ctx, src, filepath.Join(work, "src.toml"), "backup-create", "--location", loc, "--json")
	if err != nil {
		return nil, err
	}
	bs.CreateS = round3(time.Since(t0).Seconds())
	var m struct {
		Totals struct {
			GroupBytes  int64 `json:"group_bytes"`
			ColdObjects int   `json:"cold_objects"`
			ColdBytes   int64 `json:"cold_bytes"`
		} `json:"totals"`
	}
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		return nil, fmt.Errorf("backup-create --json: %w", err)
	}
	bs.ColdObjects, bs.GroupObjectBytes, bs.ColdBytes = m.Totals.ColdObjects, m.Totals.GroupBytes, m.Totals.ColdBytes
	src.Close()

	dst, err := startBackupServer(ctx, bin, filepath.Join(work, "dst"), args)
	if err != nil {
		return nil, err
	}
	defer dst.Close()
	t0 = time.Now()
	if _, err := ctl(ctx, dst, filepath.Join(work, "dst.toml"), "restore", "--yes", "--location", loc, "--json"); err != nil {
		return nil, err
	}
	bs.RestoreS = round3(time.Since(t0).Seconds())
	gib := float64(total) / (1 << 30)
	bs.CreateSPerGiB, bs.RestoreSPerGiB = round3(bs.CreateS/gib), round3(bs.RestoreS/gib)
	logf("backup %s: %.1f MiB of streams (%d cold objects, %.1f MiB in group objects): create %.2f s (%.1f s/GiB), restore %.2f s (%.1f s/GiB)",
		name, float64(total)/(1<<20), bs.ColdObjects, float64(bs.GroupObjectBytes)/(1<<20), bs.CreateS, bs.CreateSPerGiB, bs.RestoreS, bs.RestoreSPerGiB)
	return bs, nil
}

// backupUnderLoad runs the multi-stream workload twice on one server:
// alone, then with backups running back to back into one location.
func backupUnderLoad(ctx context.Context, c config, bin string, res *BackupResult, logf func(string, ...any)) error {
	work, err := os.MkdirTemp("", "ursula-bench-backup-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	srv, err := startBackupServer(ctx, bin, filepath.Join(work, "srv"), coldHeavyArgs)
	if err != nil {
		return err
	}
	defer srv.Close()
	if _, err := fill(ctx, srv.URL(), c.backupBytes/4, logf); err != nil {
		return err
	}
	b := &bench{base: srv.URL(), root: e2e.StreamRoot, runID: runID(), pid: srv.PID(), logf: logf}
	idle, err := b.multiStream(ctx, c.streams, c.payload, c.duration, nil)
	if err != nil {
		return err
	}
	loadCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var backupErr error
	wg.Go(func() {
		loc := filepath.Join(work, "backups")
		for loadCtx.Err() == nil {
			if _, err := ctl(loadCtx, srv, filepath.Join(work, "srv.toml"), "backup-create", "--location", loc, "--json"); err != nil {
				if loadCtx.Err() == nil {
					backupErr = err
				}
				return
			}
			res.BackupsDuringLoad++
		}
	})
	b.runID = runID()
	busy, err := b.multiStream(ctx, c.streams, c.payload, c.duration, nil)
	stop()
	wg.Wait()
	if err != nil {
		return err
	}
	if backupErr != nil {
		return backupErr
	}
	res.AppendOpsIdle, res.AppendOpsDuringBackup = round3(idle.OpsPerSec), round3(busy.OpsPerSec)
	if idle.OpsPerSec > 0 {
		res.AppendCostRatio = round3(busy.OpsPerSec / idle.OpsPerSec)
	}
	logf("backup under load: %.0f appends/s alone, %.0f while %d backups ran (%.2f ×)",
		idle.OpsPerSec, busy.OpsPerSec, res.BackupsDuringLoad, res.AppendCostRatio)
	return nil
}

// startBackupServer starts an all-in-one server with its data and cold
// store under dir.
func startBackupServer(ctx context.Context, bin, dir string, args []string) (*e2e.Server, error) {
	srv, err := e2e.NewServer(e2e.Options{
		Binary: bin, WorkDir: dir, ListenFlags: e2e.DefaultListenFlags,
		Args: append([]string{"-raft.wal.fsync=never", "-storage.cold.backend=fs", "-storage.cold.root=" + filepath.Join(dir, "cold")}, args...),
	})
	if err != nil {
		return nil, err
	}
	if err := srv.Start(); err != nil {
		return nil, err
	}
	if err := srv.WaitReady(ctx); err != nil {
		srv.Close()
		return nil, err
	}
	return srv, nil
}

// fill writes about total bytes into 64 streams in 64 KiB appends and
// returns what it wrote.
func fill(ctx context.Context, base string, total int64, logf func(string, ...any)) (int64, error) {
	const streams, chunk = 64, 64 << 10
	c := newHTTPClient(streams, 60*time.Second)
	defer c.CloseIdleConnections()
	payload := make([]byte, chunk)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range payload {
		payload[i] = byte(rng.Uint32())
	}
	id := runID()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		written int64
		first   error
	)
	per := total / streams
	for i := range streams {
		wg.Go(func() {
			url := fmt.Sprintf("%s%sbench-backup-%s-%02d", base, e2e.StreamRoot, id, i)
			do := func(method string, body []byte) error {
				req, _ := http.NewRequestWithContext(ctx, method, url, bytes.NewReader(body))
				req.Header.Set("Content-Type", "application/octet-stream")
				resp, err := c.Do(req)
				if err != nil {
					return err
				}
				drain(resp)
				if resp.StatusCode/100 != 2 {
					return fmt.Errorf("%s %s: %d", method, url, resp.StatusCode)
				}
				return nil
			}
			err := do(http.MethodPut, nil)
			for n := int64(0); err == nil && n < per; n += chunk {
				if err = do(http.MethodPost, payload); err == nil {
					mu.Lock()
					written += chunk
					mu.Unlock()
				}
			}
			if err != nil {
				mu.Lock()
				if first == nil {
					first = err
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	logf("backup: wrote %.1f MiB into %d streams", float64(written)/(1<<20), streams)
	return written, first
}

// ctl runs ursulactl in process against an all-in-one server (a manifest
// of its one node written to manifest) and returns its standard output.
func ctl(ctx context.Context, srv *e2e.Server, manifest string, args ...string) (string, error) {
	body := fmt.Sprintf("[[nodes]]\nid = 1\nclient_url = %q\nadmin_url = %q\nadmin_token_file = %q\n",
		"http://"+srv.Addrs["server.listen"], "http://"+srv.Addrs["server.admin_listen"], srv.AdminTokenFile())
	if err := os.WriteFile(manifest, []byte(body), 0o644); err != nil {
		return "", err
	}
	var out, errb bytes.Buffer
	full := append([]string{"--manifest", manifest, "--timeout", "10m"}, args...)
	if code := ursulactl.Run(ctx, full, ursulactl.Env{Stdout: &out, Stderr: &errb}); code != 0 {
		return out.String(), fmt.Errorf("ursulactl %s: exit %d: %s", strings.Join(args, " "), code, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}
