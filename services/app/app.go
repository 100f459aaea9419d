package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"

	"github.com/ursula/ursula/gateway"
	"github.com/ursula/ursula/gateway/subscription"
	"github.com/ursula/ursula/gateway/upstream"
	"github.com/ursula/ursula/internal/buildinfo"
	"github.com/ursula/ursula/internal/grpcmem"
	"github.com/ursula/ursula/internal/pki"
	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	coldgcv1 "github.com/ursula/ursula/proto/gen/go/ursula/coldgc/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/backup"
	"github.com/ursula/ursula/services/coldgc"
	"github.com/ursula/ursula/services/node"
	"github.com/ursula/ursula/services/platform/httpserver"
	"github.com/ursula/ursula/services/platform/lifecycle"
	"github.com/ursula/ursula/services/platform/memlimit"
	"github.com/ursula/ursula/services/platform/telemetry"
	"github.com/ursula/ursula/storage/engine"
	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/tier"
)

// shutdownDeadline bounds a graceful shutdown; past it the process exits.
const shutdownDeadline = 20 * time.Second

// telemetryFlushTimeout bounds the last export of traces and metrics at
// exit.
const telemetryFlushTimeout = 5 * time.Second

// Main runs a binary: args are os.Args, target the binary's default role.
// It returns the process exit code.
func Main(args []string, target string) int {
	grpcmem.Install()
	cfg, flags, err := Load(args[1:], target)
	if errors.Is(err, flag.ErrHelp) {
		writeUsage(os.Stdout, binaryName(args[0], target), target)
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ursula:", err)
		return 2
	}
	if flags.Version {
		writeVersion(os.Stdout, binaryName(args[0], target))
		return 0
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "ursula: invalid configuration:", err)
		return 2
	}
	logger := newLogger(cfg.Log, os.Stderr)
	for _, d := range flags.Deprecated {
		logger.Warn("deprecated setting name: use the new one", "deprecated", d.Old, "use", d.New)
	}
	if flags.PrintConfig {
		if err := writeConfig(os.Stdout, cfg); err != nil {
			fmt.Fprintln(os.Stderr, "ursula:", err)
			return 1
		}
		return 0
	}
	if flags.VerifyConfig {
		fmt.Println("configuration ok")
		return 0
	}
	sm, err := newServiceManager(os.Getenv, logger)
	if err != nil {
		logger.Error("cannot talk to the service manager", "err", err)
		return 1
	}
	defer sm.startWatchdog()()

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sigs
		logger.Info("shutting down", "signal", s.String())
		stop()
		select {
		case s = <-sigs:
			logger.Warn("second signal: exiting now", "signal", s.String())
		case <-time.After(shutdownDeadline):
			logger.Error("graceful shutdown took too long: exiting")
		}
		os.Exit(1)
	}()

	if err := Run(ctx, cfg, logger, sm); err != nil {
		logger.Error("ursula stopped with an error", "err", err)
		return 1
	}
	logger.Info("ursula stopped")
	return 0
}

// newLogger builds the process's logger: c.Level, overridden per component
// by c.Levels, with trace_id and span_id on records logged with a span's
// context. c must be valid.
func newLogger(c LogConfig, w io.Writer) *slog.Logger {
	level, _ := parseLevel(c.Level)
	levels, _ := telemetry.ParseLevels(c.Levels)
	opts := &slog.HandlerOptions{Level: levels.Min(level)}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if c.Format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(telemetry.NewLogHandler(h, level, levels))
}

// serviceNames are the default service.name of each target: the binary
// that runs it.
var serviceNames = map[string]string{
	TargetAll:     "ursula",
	TargetNode:    "ursula-node",
	TargetGateway: "ursula-gateway",
	TargetColdGC:  "ursula-coldgc",
	TargetBackup:  "ursula-backup",
}

// startTelemetry sets up traces and metrics; the returned function flushes
// and stops them.
func startTelemetry(ctx context.Context, cfg *Config, logger *slog.Logger) (*telemetry.Telemetry, func(), error) {
	id := telemetry.Identity{ServiceName: serviceNames[cfg.Target], Build: telemetry.Build(buildinfo.Get())}
	if cfg.Target == TargetAll || cfg.Target == TargetNode {
		id.ClusterID, id.NodeID = cfg.Node.ClusterID, cfg.Engine.NodeID
	}
	tel, err := telemetry.New(ctx, cfg.Telemetry, id, logger.With("component", "telemetry"))
	if err != nil {
		return nil, nil, err
	}
	if !telemetry.TracesExported() {
		// Nothing records spans: a no-op provider starts them without
		// allocating (the global one's placeholder spans cost several
		// allocations per call, on every request).
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
	}
	return tel, func() {
		sctx, cancel := context.WithTimeout(context.Background(), telemetryFlushTimeout)
		defer cancel()
		if err := tel.Shutdown(sctx); err != nil {
			logger.Warn("telemetry shutdown incomplete", "err", err)
		}
	}, nil
}

// registerMetrics exports a component's metrics source; a failure costs
// the metrics, not the process.
func registerMetrics(tel *telemetry.Telemetry, name string, src telemetry.Source, logger *slog.Logger) {
	if err := tel.RegisterSource(name, src); err != nil {
		logger.Warn("metrics not exported", "source", name, "err", err)
	}
}

// Run runs the configured roles until ctx ends or one of them fails, under
// one supervisor (package lifecycle): roles start in dependency order and
// stop in reverse, so the gateway drains first, then the node's listeners,
// then the storage, which syncs its journals last; the first role that
// fails stops the process, and Run returns its error. sm (nil: none)
// hears when the process is ready and when it stops (notify.go).
func Run(ctx context.Context, cfg *Config, logger *slog.Logger, sm *serviceManager) error {
	lim, err := memlimit.New(cfg.Runtime.Config, logger.With("component", "memlimit"))
	if err != nil {
		return err
	}
	roles := []lifecycle.Role{{Name: "memlimit", Run: lim.Run}}
	tel, stopTelemetry, err := startTelemetry(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer stopTelemetry()
	if cfg.Target == TargetColdGC {
		worker, closeConn, err := newColdGC(ctx, cfg, tel, logger)
		if err != nil {
			return err
		}
		defer closeConn()
		roles = append(roles, lifecycle.Role{Name: "coldgc", Run: worker.Run})
		var ready []<-chan struct{}
		if cfg.Node.MetricsListen != "" {
			// The worker's only listener: read-only, for a remote
			// Prometheus and a load balancer's readiness check.
			plane := coldgc.NewMetricsPlane(cfg.Node.MetricsListen, worker, tel.PrometheusHandler(), logger.With("component", "coldgc"))
			roles = append(roles, lifecycle.Role{Name: "metrics", Run: plane.Run})
			ready = append(ready, plane.Listening())
		}
		return sm.run(ctx, logger, ready, "cold GC worker running", roles...)
	}
	if cfg.Target == TargetBackup {
		svc, closeConns, err := newBackup(cfg, tel, logger)
		if err != nil {
			return err
		}
		defer closeConns()
		return sm.run(ctx, logger, nil, "backup service running", append(roles, lifecycle.Role{Name: "backup", Run: svc.Run})...)
	}

	var (
		srv   *node.Server
		ready []<-chan struct{}
	)
	if cfg.Target != TargetGateway {
		sm.status("recovering storage")
		store, err := openColdStore(ctx, cfg.Storage.Cold.Config)
		if err != nil {
			return err
		}
		clusterTLS, err := loadClusterTLS(cfg, logger)
		if err != nil {
			return err
		}
		storage, err := engine.Open(cfg.Engine, engine.Deps{ColdStore: store, ClusterTLS: clusterTLS, Logger: logger})
		if err != nil {
			return err
		}
		exported := telemetry.TracesExported() || telemetry.MetricsExported()
		deps := node.Deps{InProcess: node.NewInProcess(exported), Prometheus: tel.PrometheusHandler()}
		if cfg.Target == TargetAll && !cfg.Upstream.InProcess && len(cfg.Upstream.Nodes) == 0 && cfg.Upstream.ClientPlane == (pki.ClientPlane{}) {
			// The gateway calls this node over loopback gRPC: it proves its
			// role with a token that never leaves the process.
			tok := make([]byte, 32)
			if _, err := rand.Read(tok); err != nil {
				return err
			}
			deps.GatewayToken = hex.EncodeToString(tok)
			cfg.Upstream.Token = deps.GatewayToken
		}
		var worker *coldgc.Worker
		if cfg.Target == TargetAll {
			// The worker calls this process's node in process.
			if worker, err = coldgc.New(cfg.ColdGC, coldgcv1.NewColdGCServiceClient(deps.InProcess), store, logger.With("component", "coldgc")); err != nil {
				return err
			}
			deps.ExtraMetrics = worker.AddMetrics
		}
		if srv, err = node.New(cfg.Node, storage, deps, logger.With("component", "node")); err != nil {
			return err
		}
		ready = append(ready, srv.Listening())
		roles = append(roles,
			lifecycle.Role{Name: "storage", Run: storage.Run},
			lifecycle.Role{Name: "node", Run: srv.Run})
		if worker != nil {
			roles = append(roles, lifecycle.Role{Name: "coldgc", Run: worker.Run})
		}
		if cfg.Target == TargetAll && cfg.Backup.Location != "" {
			// The backup service calls this process's node in process,
			// as the cold-GC worker does.
			svc, err := backup.New(cfg.Backup, []backupv1.BackupServiceClient{backupv1.NewBackupServiceClient(deps.InProcess)},
				tel.PrometheusHandler(), logger.With("component", "backup"))
			if err != nil {
				return err
			}
			registerMetrics(tel, "backup", svc.MetricsSource(), logger)
			roles = append(roles, lifecycle.Role{Name: "backup", Run: svc.Run})
		}
		registerMetrics(tel, "node", srv.MetricsSource(), logger)
		registerMetrics(tel, "raft", srv.RaftMetricsSource(), logger)
		registerMetrics(tel, "wal", srv.WALMetricsSource(), logger)
	}
	if cfg.Target != TargetNode {
		var conn grpc.ClientConnInterface
		if srv != nil && cfg.Upstream.InProcess && len(cfg.Upstream.Nodes) == 0 {
			conn = srv.Conn()
		}
		var ui http.Handler
		if srv != nil {
			// The all-in-one gateway serves its node's status page.
			ui = srv.StatusPage()
		}
		gwRoles, listening, closeGateway, err := gatewayRoles(cfg, conn, ui, tel, logger)
		if err != nil {
			return err
		}
		defer closeGateway()
		roles = append(roles, gwRoles...)
		ready = append(ready, listening)
	}
	return sm.run(ctx, logger, ready, "serving (target "+cfg.Target+"); cluster readiness: GET /__ursula/ready", roles...)
}

// gatewayRoles builds the gateway's roles: the upstream router (unless conn,
// an in-process connection to this process's node, replaces it), the
// subscription manager, and the gateway itself. The returned channel is
// closed once the gateway's listener is bound; the function releases what
// the roles hold once they stopped. ui, when not nil, is the
// status page the gateway serves (its node's, in the all-in-one process);
// otherwise the gateway reads the nodes the router knows for its own.
func gatewayRoles(cfg *Config, conn grpc.ClientConnInterface, ui http.Handler, tel *telemetry.Telemetry, logger *slog.Logger) ([]lifecycle.Role, <-chan struct{}, func(), error) {
	var (
		roles   []lifecycle.Role
		closers []func()
		client  streamv1.StreamServiceClient
	)
	closeAll := func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	if conn != nil {
		client = streamv1.NewStreamServiceClient(conn)
	} else {
		ucfg := cfg.Upstream.Config
		if len(ucfg.Nodes) == 0 {
			ucfg.Nodes = []string{cfg.Node.Listen}
		}
		if ucfg.MaxMessageBytes == 0 {
			ucfg.MaxMessageBytes = cfg.Node.MaxMessageBytes
		}
		router, err := upstream.New(ucfg, logger.With("component", "upstream"))
		if err != nil {
			return nil, nil, nil, fmt.Errorf("gateway upstream: %w", err)
		}
		closers = append(closers, router.Close)
		registerMetrics(tel, "upstream", router.MetricsSource(), logger)
		roles = append(roles, lifecycle.Role{Name: "upstream", Run: router.Run})
		client = router
		if ui == nil && cfg.Gateway.StatusPage != gateway.StatusPageOff {
			page, err := gatewayStatusPage(ucfg.ClientPlane, router, logger)
			if err != nil {
				closeAll()
				return nil, nil, nil, err
			}
			ui = page
			roles = append(roles, lifecycle.Role{Name: "statuspage", Run: page.Run})
		}
	}
	// One in-flight request-body budget for every HTTP body this process
	// reads (server.http_inflight_body_size).
	budget := httpserver.NewBudget(cfg.Node.InflightBodySize())
	subCfg := cfg.Subscriptions
	subCfg.BodyBudget = budget
	if subCfg.StreamRoot == "" {
		subCfg.StreamRoot = cfg.Gateway.StreamRoot
	}
	subs, err := subscription.New(subCfg, client, logger.With("component", "subscriptions"))
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	closers = append(closers, subs.Close)
	gwCfg := cfg.Gateway
	gwCfg.BodyBudget = budget
	gwCfg.Subscriptions = subs
	gwCfg.Observer = subs
	gwCfg.Prometheus = tel.PrometheusHandler()
	gwCfg.StatusUI = ui
	gw, err := gateway.New(gwCfg, client, logger.With("component", "gateway"))
	if err != nil {
		closeAll()
		return nil, nil, nil, err
	}
	closers = append(closers, gw.Close)
	registerMetrics(tel, "gateway", gw.MetricsSource(), logger)
	roles = append(roles,
		lifecycle.Role{Name: "subscriptions", Run: subs.Run},
		lifecycle.Role{Name: "gateway", Run: gw.Run})
	if cfg.Gateway.PprofListen != "" {
		roles = append(roles, pprofRole(cfg.Gateway.PprofListen, logger.With("component", "gateway")))
	}
	return roles, gw.Listening(), closeAll, nil
}

// loadClusterTLS loads the cluster plane's certificates (nil when the
// plane is off or plaintext): the node's certificate must prove its own
// node id.
func loadClusterTLS(cfg *Config, logger *slog.Logger) (*pki.Source, error) {
	if len(cfg.Engine.Peers) < 2 {
		return nil, nil
	}
	if cfg.Node.ClusterTLS.IsZero() {
		logger.Warn("the cluster plane runs plaintext (server.insecure_cluster_plaintext): any local process can act as a node; use it for a development cluster only",
			"cluster_listen", cfg.Node.ClusterListen)
		return nil, nil
	}
	src, err := pki.Load(cfg.Node.ClusterTLS, logger.With("component", "pki", "plane", "cluster"))
	if err != nil {
		return nil, fmt.Errorf("server.cluster_tls: %w", err)
	}
	if want := pki.NodeIdentity(cfg.Engine.NodeID); src.Identity() != want {
		return nil, fmt.Errorf("server.cluster_tls: the certificate %s proves %s, but raft.node_id is %d (%s)",
			cfg.Node.ClusterTLS.CertFile, src.Identity(), cfg.Engine.NodeID, want)
	}
	return src, nil
}

// openColdStore opens the cold store and checks that its root is ours
// (the format epoch marker), before the node serves anything.
func openColdStore(ctx context.Context, cfg objstore.Config) (objstore.Store, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	store, err := objstore.Open(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cold store: %w", err)
	}
	if err := tier.CheckFormatEpoch(ctx, store); err != nil {
		return nil, err
	}
	return store, nil
}

// newColdGC builds the cold-GC worker of a split deployment against a
// storage node's ColdGCService and exports its metrics; the returned
// function closes its connection.
func newColdGC(ctx context.Context, cfg *Config, tel *telemetry.Telemetry, logger *slog.Logger) (*coldgc.Worker, func(), error) {
	store, err := openColdStore(ctx, cfg.Storage.Cold.Config)
	if err != nil {
		return nil, nil, err
	}
	creds, err := cfg.Upstream.ClientPlane.DialOptions(logger.With("component", "pki"))
	if err != nil {
		return nil, nil, fmt.Errorf("coldgc: %w", err)
	}
	conn, err := grpc.NewClient(cfg.Upstream.Nodes[0], creds...)
	if err != nil {
		return nil, nil, fmt.Errorf("coldgc: dial %s: %w", cfg.Upstream.Nodes[0], err)
	}
	worker, err := coldgc.New(cfg.ColdGC, coldgcv1.NewColdGCServiceClient(conn), store, logger.With("component", "coldgc"))
	if err != nil {
		_ = conn.Close()
		return nil, nil, err
	}
	registerMetrics(tel, "coldgc", worker.MetricsSource(), logger)
	logger.Info("cold GC worker started", "node", cfg.Upstream.Nodes[0])
	return worker, func() { _ = conn.Close() }, nil
}

// newBackup builds the backup service of the backup target against the
// storage nodes of upstream.nodes, dialled with the client plane's
// credentials (the backup role); the returned function closes the
// connections.
func newBackup(cfg *Config, tel *telemetry.Telemetry, logger *slog.Logger) (*backup.Service, func(), error) {
	creds, err := cfg.Upstream.ClientPlane.DialOptions(logger.With("component", "pki"))
	if err != nil {
		return nil, nil, fmt.Errorf("backup: %w", err)
	}
	maxMsg := cfg.Upstream.MaxMessageBytes
	if maxMsg <= 0 {
		maxMsg = upstream.DefaultMaxMessageBytes
	}
	opts := append(creds,
		// Group objects travel whole in one message.
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsg), grpc.MaxCallSendMsgSize(maxMsg)),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler()),
	)
	var (
		conns []*grpc.ClientConn
		nodes []backupv1.BackupServiceClient
	)
	closeAll := func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}
	for _, addr := range cfg.Upstream.Nodes {
		conn, err := grpc.NewClient(addr, opts...)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("backup: dial %s: %w", addr, err)
		}
		conns = append(conns, conn)
		nodes = append(nodes, backupv1.NewBackupServiceClient(conn))
	}
	svc, err := backup.New(cfg.Backup, nodes, tel.PrometheusHandler(), logger.With("component", "backup"))
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	registerMetrics(tel, "backup", svc.MetricsSource(), logger)
	return svc, closeAll, nil
}
