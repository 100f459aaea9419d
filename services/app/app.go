package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/BurntSushi/toml"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/ursula/ursula/gateway"
	"github.com/ursula/ursula/gateway/subscription"
	"github.com/ursula/ursula/gateway/upstream"
	coldgcv1 "github.com/ursula/ursula/proto/gen/go/ursula/coldgc/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/coldgc"
	"github.com/ursula/ursula/services/node"
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
	cfg, flags, err := Load(args[1:], target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "ursula:", err)
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(os.Stderr, "ursula: invalid configuration:", err)
		return 2
	}
	if flags.PrintConfig {
		if err := toml.NewEncoder(os.Stdout).Encode(cfg); err != nil {
			fmt.Fprintln(os.Stderr, "ursula:", err)
			return 1
		}
		return 0
	}
	if flags.VerifyConfig {
		fmt.Println("configuration ok")
		return 0
	}
	logger := newLogger(cfg.Log, os.Stderr)

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

	if err := Run(ctx, cfg, logger); err != nil {
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
}

// startTelemetry sets up traces and metrics; the returned function flushes
// and stops them.
func startTelemetry(ctx context.Context, cfg *Config, logger *slog.Logger) (*telemetry.Telemetry, func(), error) {
	id := telemetry.Identity{ServiceName: serviceNames[cfg.Target]}
	if cfg.Target == TargetAll || cfg.Target == TargetNode {
		id.ClusterID, id.NodeID = cfg.Node.ClusterID, cfg.Engine.NodeID
	}
	tel, err := telemetry.New(ctx, cfg.Telemetry, id, logger.With("component", "telemetry"))
	if err != nil {
		return nil, nil, err
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

// Run runs the configured roles until ctx ends. Roles stop front to back:
// the gateway drains first, then the node's listeners, then the engine,
// which syncs its journals last.
func Run(ctx context.Context, cfg *Config, logger *slog.Logger) error {
	var (
		eng *engine.Engine
		srv *node.Server
		err error
	)
	lim, err := memlimit.New(cfg.Runtime.Config, logger.With("component", "memlimit"))
	if err != nil {
		return err
	}
	limCtx, stopLim := context.WithCancel(context.Background())
	limDone := make(chan struct{})
	go func() {
		defer close(limDone)
		_ = lim.Run(limCtx)
	}()
	defer func() {
		stopLim()
		<-limDone
	}()
	if cfg.Target == TargetColdGC {
		return runColdGC(ctx, cfg, logger)
	}
	tel, stopTelemetry, err := startTelemetry(ctx, cfg, logger)
	if err != nil {
		return err
	}
	defer stopTelemetry()
	var store objstore.Store
	if cfg.Target != TargetGateway {
		if eng, err = engine.New(cfg.Engine, nil, logger.With("component", "engine")); err != nil {
			return err
		}
		if store, err = openColdStore(ctx, cfg.Cold.Config); err != nil {
			return err
		}
		eng.SetColdStore(store)
		if srv, err = node.New(cfg.Node, eng, logger.With("component", "node")); err != nil {
			return err
		}
		srv.SetPrometheusHandler(tel.PrometheusHandler())
	}

	engCtx, stopEngine := context.WithCancel(context.Background())
	defer stopEngine()
	nodeCtx, stopNode := context.WithCancel(context.Background())
	defer stopNode()
	engErr := make(chan error, 1)
	nodeErr := make(chan error, 1)
	if eng != nil {
		go func() { engErr <- eng.Run(engCtx) }()
		go func() { nodeErr <- srv.Run(nodeCtx) }()
	}

	gcCtx, stopGC := context.WithCancel(context.Background())
	defer stopGC()
	gcDone := make(chan struct{})
	if cfg.Target == TargetAll {
		worker, err := coldgc.New(cfg.ColdGC, srv.ColdGCClient(), store, logger.With("component", "coldgc"))
		if err != nil {
			return err
		}
		srv.AddMetrics(worker.AddMetrics)
		go func() {
			defer close(gcDone)
			_ = worker.Run(gcCtx)
		}()
	} else {
		close(gcDone)
	}
	if srv != nil {
		registerMetrics(tel, "node", srv.MetricsSource(), logger)
	}

	var gwErr error
	if cfg.Target != TargetNode {
		var local streamv1.StreamServiceClient
		if srv != nil && cfg.Upstream.InProcess && len(cfg.Upstream.Nodes) == 0 {
			local = srv.LocalClient()
		}
		gwErr = runGateway(ctx, cfg, local, tel, logger)
	} else {
		select {
		case <-ctx.Done():
		case err := <-engErr:
			engErr <- err
		case err := <-nodeErr:
			nodeErr <- err
		}
	}
	if eng == nil {
		return gwErr
	}
	stopGC()
	<-gcDone
	stopNode()
	nErr := <-nodeErr
	stopEngine()
	eErr := <-engErr
	return errors.Join(gwErr, nErr, eErr)
}

// runGateway runs the gateway and the subscription manager until ctx ends.
// client, when not nil, is an in-process client of this process's node;
// otherwise the gateway dials the node over gRPC.
func runGateway(ctx context.Context, cfg *Config, client streamv1.StreamServiceClient, tel *telemetry.Telemetry, logger *slog.Logger) error {
	if client == nil {
		ucfg := cfg.Upstream.Config
		if len(ucfg.Nodes) == 0 {
			ucfg.Nodes = []string{cfg.Node.Listen}
		}
		if ucfg.MaxMessageBytes == 0 {
			ucfg.MaxMessageBytes = cfg.Node.MaxMessageBytes
		}
		router, err := upstream.New(ucfg, logger.With("component", "upstream"))
		if err != nil {
			return fmt.Errorf("gateway upstream: %w", err)
		}
		defer router.Close()
		routerCtx, stopRouter := context.WithCancel(context.Background())
		defer stopRouter()
		go func() { _ = router.Run(routerCtx) }()
		registerMetrics(tel, "upstream", router.MetricsSource(), logger)
		client = router
	}

	subCfg := cfg.Subscriptions
	if subCfg.StreamRoot == "" {
		subCfg.StreamRoot = cfg.Gateway.StreamRoot
	}
	subs, err := subscription.New(subCfg, client, logger.With("component", "subscriptions"))
	if err != nil {
		return err
	}
	defer subs.Close()
	gwCfg := cfg.Gateway
	gwCfg.Subscriptions = subs
	gwCfg.Observer = subs
	gwCfg.Prometheus = tel.PrometheusHandler()
	gw, err := gateway.New(gwCfg, client, logger.With("component", "gateway"))
	if err != nil {
		return err
	}
	defer gw.Close()
	registerMetrics(tel, "gateway", gw.MetricsSource(), logger)

	subCtx, stopSubs := context.WithCancel(context.Background())
	subErr := make(chan error, 1)
	go func() { subErr <- subs.Run(subCtx) }()
	err = gw.Run(ctx)
	stopSubs()
	return errors.Join(err, <-subErr)
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

// runColdGC runs the cold-GC worker of a split deployment against a
// storage node's ColdGCService until ctx ends.
func runColdGC(ctx context.Context, cfg *Config, logger *slog.Logger) error {
	store, err := openColdStore(ctx, cfg.Cold.Config)
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(cfg.Upstream.Nodes[0], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("coldgc: dial %s: %w", cfg.Upstream.Nodes[0], err)
	}
	defer conn.Close()
	worker, err := coldgc.New(cfg.ColdGC, coldgcv1.NewColdGCServiceClient(conn), store, logger.With("component", "coldgc"))
	if err != nil {
		return err
	}
	logger.Info("cold GC worker started", "node", cfg.Upstream.Nodes[0])
	return worker.Run(ctx)
}
