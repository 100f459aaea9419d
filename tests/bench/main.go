package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	s3api "github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ursula/ursula/storage/objstore/objstoretest"
	"github.com/ursula/ursula/tests/e2e"
)

type config struct {
	server      string
	target      string
	pid         int
	fsyncModes  string
	workloads   string
	duration    time.Duration
	streams     int
	payload     int
	subscribers int
	writerRate  int
	replayCl    int
	replayEv    int
	replayBytes int
	withNull    bool
	strict      bool
	out         string
	nullListen  string
	clusterURL  string
	clusterPIDs string
	cold        string
	memWarmup   int64
	memTotal    int64
	hotCap      int64
	backupBytes int64
	peers       string
	peerDir     string
	report      string
	cluster     bool

	cardStreams       string
	cardWriters       int
	cardCreateTimeout time.Duration
	cardCluster       bool

	// changed lists the flags set to other than their defaults, apart
	// from those that say where things are (changedFlags).
	changed string
}

// defaultWorkloads is -workloads' default: a run with it (and every other
// sizing flag at its default) is a full run.
const defaultWorkloads = "multi-stream,fan-out,replay,mixed,bootstrap,memory,backup,cardinality"

func main() {
	var c config
	flag.StringVar(&c.server, "server", "", "ursula binary to start (default $URSULA_BIN, else go build ./services/cmd/ursula)")
	flag.StringVar(&c.target, "target", "", "measure this running server (origin URL) instead of starting one")
	flag.IntVar(&c.pid, "pid", 0, "with -target: the server's pid, for RSS")
	flag.StringVar(&c.fsyncModes, "fsync", "never,always", "raft.wal.fsync modes to start ursula with, in order")
	flag.StringVar(&c.workloads, "workloads", defaultWorkloads, "workloads to run, in order (memory runs only against fsync=never servers; backup and cardinality start servers of their own; mixed runs multi-stream, fan-out and replay at once)")
	flag.StringVar(&c.cold, "cold", "s3", `also run the fsync=never server with this cold store ("s3": a versitygw the bench starts; "" for none) and compare it with the local-directory run`)
	flag.Int64Var(&c.memWarmup, "memory-warmup", 20<<20, "memory: bytes appended before the first RSS sample")
	flag.Int64Var(&c.memTotal, "memory-total", 2<<30, "memory: bytes appended before the second RSS sample")
	flag.Int64Var(&c.hotCap, "hot-cap", 64<<20, "storage.cold.hot_cap_bytes of the servers the bench starts")
	flag.Int64Var(&c.backupBytes, "backup-bytes", 256<<20, "backup: stream bytes each backed-up data set holds")
	flag.DurationVar(&c.duration, "duration", 10*time.Second, "how long each workload runs")
	flag.IntVar(&c.streams, "streams", 500, "multi-stream: number of streams (one append in flight each)")
	flag.IntVar(&c.payload, "payload", 256, "multi-stream and fan-out: payload bytes")
	flag.IntVar(&c.subscribers, "subscribers", 1000, "fan-out: SSE subscribers")
	flag.IntVar(&c.writerRate, "writer-rate", 50, "fan-out: events per second")
	flag.IntVar(&c.replayCl, "replay-clients", 100, "replay: clients, each with its own stream")
	flag.IntVar(&c.replayEv, "replay-events", 200, "replay: appends pre-filled per stream")
	flag.IntVar(&c.replayBytes, "replay-event-bytes", 1024, "replay: bytes per pre-filled append")
	flag.BoolVar(&c.withNull, "null", true, "also measure the null server (204 to everything) for ratios")
	flag.BoolVar(&c.strict, "strict", false, "exit 1 when a target is missed")
	flag.StringVar(&c.out, "out", "", "also write the JSON report to this file")
	flag.StringVar(&c.nullListen, "null.listen", "", "run only the null server on this address (used internally)")
	flag.BoolVar(&c.cluster, "cluster", true, "also start a 3-node cluster behind ursula-gateway (fsync never; ursula-node and ursula-gateway next to -server) and run multi-stream, fan-out, replay and mixed against it")
	flag.StringVar(&c.clusterURL, "cluster-url", "", "measure a running cluster's gateway (e.g. make run-cluster's http://127.0.0.1:4437) instead of starting one")
	flag.StringVar(&c.clusterPIDs, "cluster-pids", "", "with -cluster-url: comma-separated pids of the cluster's processes, for RSS")
	flag.StringVar(&c.peers, "peers", "", `peer servers to measure in the same run ("node": the Node reference server in memory and on files, installed with npm ci into -peer-dir)`)
	flag.StringVar(&c.peerDir, "peer-dir", "", "where -peers node installs the Node reference server (default node-peer next to the -server binary, else bin/node-peer)")
	flag.StringVar(&c.cardStreams, "cardinality-streams", "500,10000,100000,1000000", "cardinality: the stream counts of the sweep (k and m suffixes allowed; a shorter list for a quick run, e.g. 500,10k)")
	flag.IntVar(&c.cardWriters, "cardinality-writers", 500, "cardinality: writers appending round-robin over the streams, one request in flight each")
	flag.BoolVar(&c.cardCluster, "cardinality-cluster", false, "cardinality: also sweep on a fresh 3-node cluster per stream count, through its gateway (long: a million streams take minutes to create; raise -cardinality-create-timeout)")
	flag.DurationVar(&c.cardCreateTimeout, "cardinality-create-timeout", 5*time.Minute, "cardinality: how long creating one sweep point's streams may take; a point that does not make it is reported as such, and larger ones are not tried")
	flag.StringVar(&c.report, "report", "", "also write a Markdown report to this file, with SVG plots in img/bench-*.svg beside it")
	flag.Parse()
	c.changed = changedFlags(flag.CommandLine)

	if c.nullListen != "" {
		if err := runNullServer(c.nullListen); err != nil {
			fmt.Fprintln(os.Stderr, "null server:", err)
			os.Exit(1)
		}
		return
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx, c)
	if rep != nil {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		enc.Encode(rep)
		if c.out != "" {
			b, _ := json.MarshalIndent(rep, "", "  ")
			if werr := os.WriteFile(c.out, append(b, '\n'), 0o644); werr != nil {
				fmt.Fprintln(os.Stderr, "bench:", werr)
			}
		}
		if c.report != "" && err == nil {
			if werr := writeReport(rep, c.report); werr != nil {
				fmt.Fprintln(os.Stderr, "bench:", werr)
			}
		}
	}
	e2e.RemoveBuilt()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	if c.strict {
		for _, t := range rep.Targets {
			if !t.OK && !t.NotMeasured {
				fmt.Fprintf(os.Stderr, "bench: target missed: %s (want %s, got %v)\n", t.Name, t.Want, t.Got)
				os.Exit(1)
			}
		}
	}
}

// Report is the JSON document bench prints.
type Report struct {
	Started string         `json:"started"`
	Machine map[string]any `json:"machine"`
	Config  map[string]any `json:"config"`
	Servers []*ServerRun   `json:"servers"`
	Ratios  map[string]any `json:"ratios_to_null,omitempty"`
	Targets []Target       `json:"targets,omitempty"`
	Backup  *BackupResult  `json:"backup,omitempty"`
	// Cardinality is the cardinality sweep per server.
	Cardinality []*CardinalityRun `json:"cardinality,omitempty"`
	Notes       map[string]string `json:"notes,omitempty"`
}

// ServerRun is every workload against one server process.
type ServerRun struct {
	Name    string `json:"name"`
	Command string `json:"command,omitempty"`
	PID     int    `json:"pid,omitempty"`
	// RSSPeakMiB is VmHWM before the server was stopped, or before the
	// memory workload started when it ran: its peak RSS.
	RSSPeakMiB float64 `json:"rss_peak_mib,omitempty"`
	// RSSPeakPerProcessMiB is VmHWM per process of a server made of
	// several (a cluster); RSSPeakMiB is then their sum.
	RSSPeakPerProcessMiB map[string]float64 `json:"rss_peak_per_process_mib,omitempty"`
	Workloads            map[string]*Result `json:"workloads"`
	Errors               map[string]string  `json:"errors,omitempty"`
}

// Target is one published goal and whether this run met it.
type Target struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  any    `json:"got"`
	OK   bool   `json:"ok"`
	// NotMeasured marks a target of the issue this run cannot check (its
	// reference is not in the run); Got is then context, and -strict
	// ignores it.
	NotMeasured bool `json:"not_measured,omitempty"`
}

func run(ctx context.Context, c config) (*Report, error) {
	rep := &Report{
		Started: time.Now().UTC().Format(time.RFC3339),
		Machine: map[string]any{"cpus": runtime.NumCPU(), "go": runtime.Version(), "os": runtime.GOOS + "/" + runtime.GOARCH},
		Config: map[string]any{
			"duration_s": c.duration.Seconds(), "streams": c.streams, "payload_bytes": c.payload,
			"subscribers": c.subscribers, "writer_rate": c.writerRate, "replay_clients": c.replayCl,
			"replay_events": c.replayEv, "replay_event_bytes": c.replayBytes, "workloads": c.workloads,
		},
	}
	if c.changed != "" {
		rep.Config["flags"] = c.changed
	}
	machineInfo(rep.Machine)
	workloads := splitList(c.workloads)
	for _, w := range workloads {
		switch w {
		case "multi-stream", "fan-out", "replay", "mixed", "bootstrap", "memory", "backup", "cardinality":
		default:
			return nil, fmt.Errorf("unknown workload %q", w)
		}
	}
	var counts []int
	if slices.Contains(workloads, "cardinality") {
		var err error
		if counts, err = parseCounts(c.cardStreams); err != nil {
			return nil, fmt.Errorf("-cardinality-streams: %w", err)
		}
		rep.Config["cardinality_streams"] = c.cardStreams
		rep.Config["cardinality_writers"] = c.cardWriters
		rep.Config["cardinality_create_timeout_s"] = c.cardCreateTimeout.Seconds()
	}
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05")+" "+format+"\n", args...)
	}

	if c.target != "" {
		sr := &ServerRun{Name: "target", Command: c.target, PID: c.pid}
		var procs []proc
		if c.pid > 0 {
			procs = []proc{{"target", c.pid}}
		}
		b := newBench(c.target, procs, false, logf)
		runWorkloads(ctx, c, b, sr, workloads)
		if c.pid > 0 {
			sr.RSSPeakMiB, _ = procStatusMiB(c.pid, "VmHWM")
		}
		rep.Servers = append(rep.Servers, sr)
		if len(counts) > 0 {
			rep.addNote("cardinality", "not run against -target: it needs a fresh server per stream count")
		}
		return rep, ctx.Err()
	}

	if c.withNull {
		self, err := os.Executable()
		if err != nil {
			return rep, err
		}
		sr, err := measure(ctx, c, serverSpec{name: "null", opts: e2e.Options{
			Binary: self, ListenFlags: []string{"null.listen"}, ReadyFlag: "null.listen",
		}}, true, workloads, logf)
		if sr != nil {
			rep.Servers = append(rep.Servers, sr)
		}
		if err != nil {
			return rep, err
		}
	}
	bin := c.server
	if bin == "" {
		var err error
		if bin, err = e2e.Binary("ursula"); err != nil {
			return rep, err
		}
	}
	hotCap := fmt.Sprintf("-storage.cold.hot_cap_bytes=%d", c.hotCap)
	ursula := func(mode string) serverSpec {
		return serverSpec{name: "ursula fsync=" + mode, opts: e2e.Options{Binary: bin, ListenFlags: e2e.DefaultListenFlags, Args: []string{"-raft.wal.fsync=" + mode, hotCap}}}
	}
	// The servers the cardinality sweep runs against, each started fresh
	// per stream count.
	cardServers := []serverSpec{ursula("never")}
	cardServers[0].durable = true
	for _, mode := range splitList(c.fsyncModes) {
		sr, err := measure(ctx, c, ursula(mode), false, workloads, logf)
		if sr != nil {
			rep.Servers = append(rep.Servers, sr)
		}
		if err != nil {
			return rep, err
		}
	}
	for _, p := range splitList(c.peers) {
		if p != "node" {
			return rep, fmt.Errorf("unknown peer %q (known: node)", p)
		}
		dir := c.peerDir
		if dir == "" {
			dir = filepath.Join("bin", "node-peer")
			if c.server != "" {
				dir = filepath.Join(filepath.Dir(c.server), "node-peer")
			}
		}
		script, err := installNodePeer(ctx, dir, logf)
		if errors.Is(err, errNoNPM) {
			logf("node peer: skipped: %v", err)
			rep.addNote("node_peer", "skipped: node and npm are not on PATH")
			continue
		}
		if err != nil {
			return rep, fmt.Errorf("install the node peer: %w", err)
		}
		rep.Machine["node"] = nodeVersion()
		if slices.Contains(workloads, "bootstrap") {
			rep.addNote("bootstrap", "not run against the Node peer: /{bucket}/{stream}/bootstrap is Ursula's own route")
		}
		for _, p := range nodePeerOptions(script) {
			spec := serverSpec{name: p.name, opts: p.opts, ready: waitAnswer}
			if p.name == "node memory" {
				cardServers = append(cardServers, spec)
			}
			sr, err := measure(ctx, c, spec, false, workloads, logf)
			if sr != nil {
				rep.Servers = append(rep.Servers, sr)
				noteNode404(rep, sr)
			}
			if err != nil {
				return rep, err
			}
		}
	}
	if c.cold == "s3" {
		s3, err := objstoretest.StartS3Server()
		if err != nil {
			return rep, fmt.Errorf("start the S3 server: %w", err)
		}
		defer s3.Close()
		bucket := "ursula-bench"
		if _, err := s3.Client().CreateBucket(ctx, &s3api.CreateBucketInput{Bucket: &bucket}); err != nil {
			return rep, fmt.Errorf("create the S3 bucket: %w", err)
		}
		prefix := "ursula-bench-" + time.Now().UTC().Format("20060102T150405Z")
		sr, err := measure(ctx, c, serverSpec{name: "ursula fsync=never cold=s3", opts: e2e.Options{
			Binary: bin, ListenFlags: e2e.DefaultListenFlags,
			Args: []string{"-raft.wal.fsync=never", hotCap, "-storage.cold.backend=s3", "-storage.cold.s3.bucket=" + bucket, "-storage.cold.root=" + prefix,
				"-storage.cold.s3.endpoint=" + s3.Endpoint, "-storage.cold.s3.region=us-east-1", "-storage.cold.s3.path_style"},
			Env: []string{"AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3.SecretKey},
		}}, false, workloads, logf)
		if sr != nil {
			rep.Servers = append(rep.Servers, sr)
		}
		if err != nil {
			return rep, err
		}
	}
	switch {
	case c.clusterURL != "":
		sr := &ServerRun{Name: clusterName, Command: c.clusterURL}
		b := newBench(c.clusterURL, nil, false, logf)
		logf("cluster: measuring %s", c.clusterURL)
		runWorkloads(ctx, c, b, sr, workloads)
		for _, p := range splitList(c.clusterPIDs) {
			var pid int
			if _, err := fmt.Sscan(p, &pid); err == nil {
				if v, err := procStatusMiB(pid, "VmHWM"); err == nil {
					sr.RSSPeakMiB += v
				}
			}
		}
		rep.Servers = append(rep.Servers, sr)
	case c.cluster:
		sr, err := measureCluster(ctx, c, bin, workloads, logf)
		if sr != nil {
			rep.Servers = append(rep.Servers, sr)
		}
		if err != nil {
			// A cluster that does not start is a finding, not a reason to
			// lose the rest of the run.
			if ctx.Err() != nil {
				return rep, err
			}
			logf("cluster: %v", err)
			rep.addNote("cluster", "not measured: "+oneLine(err.Error()))
		}
	}
	if slices.Contains(workloads, "backup") {
		logf("backup: create and restore, hot-only and cold-heavy, %d MiB each", c.backupBytes>>20)
		res, err := backupWorkload(ctx, c, bin, logf)
		rep.Backup = res
		if err != nil {
			return rep, fmt.Errorf("backup workload: %w", err)
		}
	}
	if len(counts) > 0 {
		for _, spec := range cardServers {
			logf("%s: cardinality sweep over %v streams, a fresh server each", spec.name, counts)
			rep.Cardinality = append(rep.Cardinality, cardinality(ctx, c, counts, spec, logf))
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
		}
		if c.cardCluster {
			logf("cluster: cardinality sweep over %v streams, a fresh cluster each", counts)
			rep.Cardinality = append(rep.Cardinality, clusterCardinality(ctx, c, counts, bin, logf))
			if ctx.Err() != nil {
				return rep, ctx.Err()
			}
		}
	}
	evaluate(rep, c)
	return rep, nil
}

// serverSpec is how the bench starts one server: its process options and
// how to wait until it serves (nil: srv.WaitReady).
type serverSpec struct {
	name  string
	opts  e2e.Options
	ready func(context.Context, *e2e.Server) error
	// durable says the server keeps its streams across a restart (the
	// cardinality workload times its start at the largest count).
	durable bool
}

// startServer starts a server and waits until it serves. The caller
// closes it.
func startServer(ctx context.Context, spec serverSpec) (*e2e.Server, error) {
	srv, err := e2e.NewServer(spec.opts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", spec.name, err)
	}
	if err := srv.Start(); err != nil {
		srv.Close()
		return nil, fmt.Errorf("%s: %w", spec.name, err)
	}
	ready := spec.ready
	if ready == nil {
		ready = func(ctx context.Context, srv *e2e.Server) error { return srv.WaitReady(ctx) }
	}
	if err := ready(ctx, srv); err != nil {
		srv.Close()
		return nil, fmt.Errorf("%s: %w", spec.name, err)
	}
	return srv, nil
}

// ownServers are the workloads that start servers of their own.
var ownServers = map[string]bool{"backup": true, "cardinality": true}

// measure starts one server, runs the workloads against it and stops it;
// it starts nothing (and returns nil) when every workload starts servers
// of its own.
func measure(ctx context.Context, c config, spec serverSpec, isNull bool, workloads []string, logf func(string, ...any)) (*ServerRun, error) {
	if !slices.ContainsFunc(workloads, func(w string) bool { return !ownServers[w] }) {
		return nil, nil
	}
	srv, err := startServer(ctx, spec)
	if err != nil {
		return nil, err
	}
	defer srv.Close()
	name := spec.name
	sr := &ServerRun{Name: name, Command: srv.Bin + " " + strings.Join(srv.Args(), " "), PID: srv.PID()}
	logf("%s: pid %d ready at %s", name, srv.PID(), srv.URL())
	b := newBench(srv.URL(), []proc{{name, srv.PID()}}, isNull, logf)
	runWorkloads(ctx, c, b, sr, workloads)
	if v, err := procStatusMiB(srv.PID(), "VmHWM"); err == nil && sr.RSSPeakMiB == 0 {
		sr.RSSPeakMiB = v
	}
	if srv.Running() {
		if err := srv.Terminate(30 * time.Second); err != nil {
			sr.addErr("shutdown", err)
		}
	} else {
		sr.addErr("server", fmt.Errorf("exited during the run: %v; log tail:\n%s", srv.ExitErr(), srv.LogTail(30)))
	}
	return sr, ctx.Err()
}

func runWorkloads(ctx context.Context, c config, b *bench, sr *ServerRun, workloads []string) {
	sr.Workloads = map[string]*Result{}
	for _, w := range workloads {
		if ctx.Err() != nil {
			return
		}
		switch {
		case ownServers[w]:
			continue
		case w == "bootstrap" && strings.HasPrefix(sr.Name, "node "):
			continue // Ursula's own route: the Node peer answers 404
		case w == "memory" && (b.isNull || !strings.Contains(sr.Name, "never") || len(b.procs) > 1):
			continue
		case w == "memory":
			// The peak RSS target is about the other workloads: record
			// it before this one fills the hot windows on purpose.
			if v, err := procStatusMiB(b.pid, "VmHWM"); err == nil {
				sr.RSSPeakMiB = v
			}
		}
		b.logf("%s: %s for %v", sr.Name, w, c.duration)
		var res *Result
		var err error
		b.takeMeasured()
		cpu0, cpuErr := cpuTimes(b.procs)
		var each *rssSampler
		if len(b.procs) > 1 {
			each = sampleRSS(b.procs...)
		}
		switch w {
		case "multi-stream":
			res, err = b.multiStream(ctx, c.streams, c.payload, c.duration, nil)
		case "fan-out":
			res, err = b.fanOut(ctx, c.subscribers, c.writerRate, c.payload, c.duration, nil)
		case "replay":
			res, err = b.replay(ctx, c.replayCl, c.replayEv, c.replayBytes, c.duration, nil)
		case "mixed":
			res, err = b.mixed(ctx, c)
		case "bootstrap":
			res, err = b.bootstrap(ctx, c.replayCl, c.replayEv, c.replayBytes, c.duration)
		case "memory":
			res, err = b.memoryGrowth(ctx, c.memWarmup, c.memTotal)
		}
		if each != nil {
			each.Stop()
		}
		if err != nil {
			sr.addErr(w, err)
			b.logf("%s: %s failed: %v", sr.Name, w, err)
			continue
		}
		cpu1, err := cpuTimes(b.procs)
		// Mixed runs three workloads at once, each marking its own start:
		// it counts from its own start instead.
		if from, to := b.takeMeasured(); from != nil && w != "mixed" {
			cpu0 = from
			if to != nil {
				cpu1 = to
			}
		}
		if err == nil && cpuErr == nil && len(b.procs) > 0 && res.Ops > 0 {
			var total time.Duration
			for i, p := range b.procs {
				d := cpu1[i] - cpu0[i]
				total += d
				if each != nil {
					if res.Processes == nil {
						res.Processes = map[string]*ProcUsage{}
					}
					res.Processes[p.name] = &ProcUsage{
						ServerCPUS: round3(d.Seconds()),
						CPUPerOpUS: round3(float64(d) / 1e3 / float64(res.Ops)),
						RSSMaxMiB:  each.perProcess()[p.name],
					}
				}
			}
			res.ServerCPUS = round3(total.Seconds())
			res.CPUPerOpUS = round3(float64(total) / 1e3 / float64(res.Ops))
		}
		sr.Workloads[w] = res
		b.logf("%s: %s: %.0f ops/s, p50 %.2f ms, p99 %.2f ms, p999 %.2f ms, server CPU %.1f µs/op, errors %v",
			sr.Name, w, res.OpsPerSec, res.Latency.P50MS, res.Latency.P99MS, res.Latency.P999MS, res.CPUPerOpUS, res.Errors)
	}
}

func (rep *Report) addNote(k, v string) {
	if rep.Notes == nil {
		rep.Notes = map[string]string{}
	}
	rep.Notes[k] = v
}

func (sr *ServerRun) addErr(k string, err error) {
	if sr.Errors == nil {
		sr.Errors = map[string]string{}
	}
	sr.Errors[k] = err.Error()
}

// evaluate fills in ratios to null and the targets.
func evaluate(rep *Report, c config) {
	find := func(name string) *ServerRun {
		for _, s := range rep.Servers {
			if s.Name == name {
				return s
			}
		}
		return nil
	}
	null := find("null")
	rep.Ratios = map[string]any{}
	ratio := func(s *ServerRun, w string) (float64, bool) {
		if null == nil || s == nil || null.Workloads[w] == nil || s.Workloads[w] == nil || null.Workloads[w].OpsPerSec == 0 {
			return 0, false
		}
		return round3(s.Workloads[w].OpsPerSec / null.Workloads[w].OpsPerSec), true
	}
	add := func(name, want string, got any, ok bool) {
		rep.Targets = append(rep.Targets, Target{Name: name, Want: want, Got: got, OK: ok})
	}
	for _, mode := range splitList(c.fsyncModes) {
		s := find("ursula fsync=" + mode)
		if s == nil {
			continue
		}
		if r, ok := ratio(s, "multi-stream"); ok {
			rep.Ratios["multi_stream_ops_fsync_"+mode] = r
			if want := map[string]float64{"never": 0.68, "always": 0.50}[mode]; want > 0 && c.streams == 500 {
				add(fmt.Sprintf("multi-stream 500 streams, fsync %s: ops/s vs null", mode),
					fmt.Sprintf(">= %.2f", want), r, r >= want)
			}
		}
		if s.Workloads["replay"] != nil && null != nil && null.Workloads["replay"] != nil && null.Workloads["replay"].Latency.P99MS > 0 {
			rep.Ratios["replay_p99_fsync_"+mode] = round3(s.Workloads["replay"].Latency.P99MS / null.Workloads["replay"].Latency.P99MS)
		}
		if s.RSSPeakMiB > 0 {
			add(fmt.Sprintf("peak RSS, fsync %s", mode), "<= 165 MiB", s.RSSPeakMiB, s.RSSPeakMiB <= 165)
		}
		if f := s.Workloads["fan-out"]; f != nil && c.subscribers == 1000 {
			all, _ := f.Extra["all_delivered"].(bool)
			add(fmt.Sprintf("fan-out 1000 subscribers, fsync %s: p99 ms", mode), "<= 25",
				f.Latency.P99MS, f.Latency.P99MS <= 25 && f.Latency.Count > 0)
			add(fmt.Sprintf("fan-out 1000 subscribers, fsync %s: events missed", mode), "0",
				f.Extra["missing"], all)
		}
		if r := s.Workloads["replay"]; r != nil && c.replayCl == 100 {
			add(fmt.Sprintf("replay 100 clients, fsync %s: p99 ms", mode), "<= 28",
				r.Latency.P99MS, r.Latency.P99MS <= 28 && r.Latency.Count > 0)
		}
	}
	fs, s3 := find("ursula fsync=never"), find("ursula fsync=never cold=s3")
	if fs != nil && s3 != nil {
		for _, w := range []string{"multi-stream", "replay"} {
			if fs.Workloads[w] != nil && s3.Workloads[w] != nil && fs.Workloads[w].OpsPerSec > 0 {
				r := round3(s3.Workloads[w].OpsPerSec / fs.Workloads[w].OpsPerSec)
				rep.Ratios[w+"_ops_s3_vs_local_dir"] = r
				add(w+", fsync never: S3 cold store vs local directory, ops/s", ">= 0.90", r, r >= 0.90)
			}
		}
	}
	for _, s := range []*ServerRun{fs, s3} {
		if s == nil || s.Workloads["memory"] == nil {
			continue
		}
		x := s.Workloads["memory"].Extra
		warm, _ := x["rss_after_warmup_mib"].(float64)
		tot, _ := x["rss_after_total_mib"].(float64)
		bound := warm + float64(c.hotCap)/(1<<20)
		add(fmt.Sprintf("%s: RSS after %v <= RSS after %v + hot cap (MiB)", s.Name, x["total_label"], x["warmup_label"]),
			fmt.Sprintf("<= %.1f", bound), tot, tot > 0 && tot <= bound)
	}
	never, always := find("ursula fsync=never"), find("ursula fsync=always")
	if never != nil && always != nil && never.Workloads["multi-stream"] != nil && always.Workloads["multi-stream"] != nil && never.Workloads["multi-stream"].OpsPerSec > 0 {
		r := round3(always.Workloads["multi-stream"].OpsPerSec / never.Workloads["multi-stream"].OpsPerSec)
		rep.Ratios["multi_stream_ops_always_vs_never"] = r
		add("multi-stream: fsync always vs fsync never, ops/s", ">= 0.90", r, r >= 0.90)
	}
	if m := never.workload("multi-stream"); m != nil {
		notMeasured := func(name, want string, got any) {
			rep.Targets = append(rep.Targets, Target{Name: name, Want: want, Got: got, NotMeasured: true})
		}
		notMeasured("multi-stream, fsync never: server CPU per append (µs)", "<= 0.8 × the official Go server's in memory (not in this run; checked independently)", m.CPUPerOpUS)
		notMeasured("multi-stream, fsync never: ops/s vs null", ">= 1.15 × the official Go server's in memory (not in this run; checked independently)", rep.Ratios["multi_stream_ops_fsync_never"])
	}
	if never != nil {
		for _, mr := range mixedRatios(never) {
			add(fmt.Sprintf("mixed load, fsync never: %s p99 vs alone", mr.Workload), "<= 1.50", mr.Ratio, mr.Ratio > 0 && mr.Ratio <= 1.5)
		}
	}
	for _, run := range rep.Cardinality {
		if run.Server != "ursula fsync=never" {
			continue
		}
		base, top := cardPoint(run, 500), cardPoint(run, 1_000_000)
		if top == nil {
			continue
		}
		if top.Append == nil {
			add("1,000,000 streams, fsync never: measured", "created and appended to", top.Skipped, false)
			continue
		}
		add("1,000,000 streams, fsync never: peak RSS (MiB)", "<= 1536", top.RSSPeakMiB, top.RSSPeakMiB > 0 && top.RSSPeakMiB <= 1536)
		add("1,000,000 streams, fsync never: start after a graceful stop (s)", "<= 30", top.StartAfterStopS, top.StartAfterStopS > 0 && top.StartAfterStopS <= 30)
		add("1,000,000 streams, fsync never: start after SIGKILL (s)", "<= 30", top.StartAfterCrashS, top.StartAfterCrashS > 0 && top.StartAfterCrashS <= 30)
		if base != nil && base.Append != nil && base.Append.OpsPerSec > 0 {
			r := round3(top.Append.OpsPerSec / base.Append.OpsPerSec)
			add("1,000,000 streams, fsync never: append ops/s vs 500 streams", ">= 0.80", r, r >= 0.80)
		}
	}
	if s := find(clusterName); s != nil {
		if r, ok := ratio(s, "multi-stream"); ok {
			rep.Ratios["multi_stream_ops_cluster"] = r
			if c.streams == 500 {
				add("multi-stream 500 streams, 3-node cluster through its gateway: ops/s vs null", ">= 0.45", r, r >= 0.45)
			}
		}
		if f := s.Workloads["fan-out"]; f != nil && c.subscribers == 1000 {
			all, _ := f.Extra["all_delivered"].(bool)
			add("fan-out 1000 subscribers, 3-node cluster: p99 ms", "<= 25", f.Latency.P99MS, f.Latency.P99MS <= 25 && f.Latency.Count > 0)
			add("fan-out 1000 subscribers, 3-node cluster: events missed", "0", f.Extra["missing"], all)
		}
		errs := 0
		for _, w := range []string{"multi-stream", "fan-out", "replay", "mixed"} {
			if r := s.Workloads[w]; r != nil {
				for _, n := range r.Errors {
					errs += n
				}
			}
		}
		if len(s.Workloads) > 0 {
			add("3-node cluster: 503s and other errors under load, no faults", "0", errs, errs == 0)
		}
		if m := s.Workloads["multi-stream"]; m != nil && m.Processes["gateway"] != nil {
			ref := "?"
			if a := never.workload("multi-stream"); a != nil {
				ref = fmt.Sprintf("%.1f", a.CPUPerOpUS)
			}
			rep.Targets = append(rep.Targets, Target{
				Name:        "3-node cluster: gateway CPU per append (µs)",
				Want:        "<= the all-in-one binary's HTTP front (its whole process: " + ref + " µs; the front's share needs a profile)",
				Got:         m.Processes["gateway"].CPUPerOpUS,
				NotMeasured: true,
			})
		}
	}
	if run := cardRun(rep, clusterName); run != nil {
		base, top := cardPoint(run, 500), cardPoint(run, 1_000_000)
		switch {
		case top == nil:
		case top.Append == nil:
			add("1,000,000 streams, 3-node cluster: measured", "created and appended to", top.Skipped, false)
		default:
			add("1,000,000 streams, 3-node cluster: largest node's peak RSS (MiB)", "<= 1536", top.RSSPeakMiB, top.RSSPeakMiB > 0 && top.RSSPeakMiB <= 1536)
			errs := 0
			for _, n := range top.Append.Errors {
				errs += n
			}
			add("1,000,000 streams, 3-node cluster: 503s and other errors", "0", errs, errs == 0)
			if base != nil && base.Append != nil && base.Append.OpsPerSec > 0 {
				r := round3(top.Append.OpsPerSec / base.Append.OpsPerSec)
				add("1,000,000 streams, 3-node cluster: append ops/s vs 500 streams", ">= 0.80", r, r >= 0.80)
			}
		}
	} else if len(rep.Cardinality) > 0 {
		rep.Targets = append(rep.Targets,
			Target{Name: "1,000,000 streams on the 3-node cluster", Want: "as on one node (not measured in this run: -cardinality-cluster)", NotMeasured: true})
	}
	if c.streams != 500 || c.subscribers != 1000 || c.replayCl != 100 {
		rep.addNote("targets", "throughput and latency targets are defined for 500 streams, "+
			"1000 subscribers and 100 replay clients; those of other sizes are left out")
	}
}

// placeFlags say where binaries, peers and outputs are, or how strict the
// exit status is: they do not change what a run measures.
var placeFlags = map[string]bool{"server": true, "peers": true, "peer-dir": true, "report": true, "out": true, "strict": true}

// changedFlags lists the flags of fs set to a value other than their
// default (placeFlags apart), as "-name=value" separated by spaces.
func changedFlags(fs *flag.FlagSet) string {
	var out []string
	fs.Visit(func(f *flag.Flag) {
		if !placeFlags[f.Name] && f.Value.String() != f.DefValue {
			out = append(out, "-"+f.Name+"="+f.Value.String())
		}
	})
	return strings.Join(out, " ")
}

// workload is the result of w, nil when s or the result is missing.
func (s *ServerRun) workload(w string) *Result {
	if s == nil {
		return nil
	}
	return s.Workloads[w]
}

// cardRun is the sweep against the named server, if the run has one.
func cardRun(rep *Report, server string) *CardinalityRun {
	for _, run := range rep.Cardinality {
		if run.Server == server {
			return run
		}
	}
	return nil
}

// cardPoint is run's point for n streams, nil if the sweep had none.
func cardPoint(run *CardinalityRun, n int) *CardinalityPoint {
	for _, p := range run.Points {
		if p.Streams == n {
			return p
		}
	}
	return nil
}

// runNullServer answers 204 to every request without storing anything (200
// on /__ursula/ready, so the harness can wait for it).
func runNullServer(addr string) error {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/__ursula/ready" {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func runID() string { return fmt.Sprintf("%x", time.Now().UnixNano()) }
