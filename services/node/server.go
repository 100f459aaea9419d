package node

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/ursula/ursula/internal/pki"
	adminv1 "github.com/ursula/ursula/proto/gen/go/ursula/admin/v1"
	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	coldgcv1 "github.com/ursula/ursula/proto/gen/go/ursula/coldgc/v1"
	streamv1 "github.com/ursula/ursula/proto/gen/go/ursula/stream/v1"
	"github.com/ursula/ursula/services/platform/httpserver"
	"github.com/ursula/ursula/services/platform/inproc"
	"github.com/ursula/ursula/services/platform/listenmux"
	"github.com/ursula/ursula/services/platform/statuspage"
	"github.com/ursula/ursula/services/platform/telemetry"
	"github.com/ursula/ursula/storage/cluster"
	"github.com/ursula/ursula/storage/engine"
	"github.com/ursula/ursula/storage/multiraft"
	"github.com/ursula/ursula/storage/stream"
	"github.com/ursula/ursula/storage/transport"
)

// maxHTTPBodyBytes bounds a request body on the node's HTTP servers; no
// route of theirs takes one, but the admin plane's backup routes (group
// objects up to max_message_bytes, backup_http.go).
const maxHTTPBodyBytes = 1 << 20

// Server is a storage node's network front.
type Server struct {
	cfg         Config
	n           *engine.Node
	logger      *slog.Logger
	metrics     metrics
	incarnation string
	// page is the cluster status page (statuspage.go); uiStop ends its
	// live connections when the node stops.
	page   *statuspage.Page
	uiStop context.Context
	// adminToken is the digest of server.admin_token_file's token, read
	// from adminTokenFile; adminTLS serves the admin plane over TLS (nil:
	// plaintext, loopback only); adminHosts are the Host values it answers.
	adminToken     *adminToken
	adminTokenFile string
	adminTLS       *pki.Source
	adminHosts     map[string]bool
	adminLoopback  bool
	// audit records the admin mutations; adminAuthRefusals counts the
	// requests refused before authentication (not recorded).
	audit             *auditLog
	adminAuthRefusals atomic.Uint64
	// conns caps the connections of each plane Run serves.
	conns planeConns
	// planInFlight holds the groups a recovery plan request is being taken
	// for (recovery.go): a second one is refused with plan_in_flight.
	planInFlight sync.Map
	// clientTLS serves the client plane over TLS (nil: plaintext);
	// clientAuth guards its gRPC calls.
	clientTLS  *pki.Source
	clientAuth *clientAuth

	grpcServer *grpc.Server
	// health is the client plane's grpc.health.v1, following readiness.
	health *nodeHealth
	// adminGRPC serves AdminService on the admin listener (nil without an
	// admin plane).
	adminGRPC *grpc.Server
	// local serves the same services in-process (Conn).
	local   *inproc.Server
	streams *streamService
	coldgc  *coldGCService
	backup  *backupService
	// backupBudget bounds the request bodies the admin plane's backup
	// routes hold at once.
	backupBudget *httpserver.Budget
	deps         Deps
	// plane is the cluster plane of a multi-node cluster (nil otherwise).
	plane   *cluster.GRPC
	readyMu sync.Mutex
	// stopping is set when a graceful shutdown begins.
	stopping atomic.Bool
	ready    bool
	// listening is closed once Run has bound every listener (Listening).
	listening chan struct{}
}

// Deps are what a node server takes from the roles that share its process.
type Deps struct {
	// InProcess serves the client plane's services to the roles of this
	// process (NewInProcess); nil makes an instrumented one, for the node's
	// own use.
	InProcess *inproc.Server
	// Prometheus serves GET /__ursula/prometheus on the admin plane; nil
	// answers 404.
	Prometheus http.Handler
	// ExtraMetrics adds the metrics of roles running beside the node (the
	// all-in-one cold-GC worker) to /__ursula/metrics.
	ExtraMetrics func(map[string]any)
	// GatewayToken, when set, is a bearer token the client plane takes as
	// the gateway role: the all-in-one gateway's, when it calls this node
	// over loopback gRPC instead of in process. It lives only in the
	// process's memory.
	GatewayToken string
}

// NewInProcess is the in-process connection of a node server, for the
// roles that share its process (see Conn). Instrumented, it runs the stats
// handlers the client plane's gRPC server and the gateway's router run, so
// a call makes the same client and server spans and rpc metrics as over
// the network. They cost a fifth of an all-in-one append's CPU (measured
// with the multi-stream benchmark), so a process that exports no traces
// and no OTLP metrics, where nobody would see them, runs without.
func NewInProcess(instrumented bool) *inproc.Server {
	if !instrumented {
		return inproc.NewServer()
	}
	return inproc.NewServer(inproc.WithServerStatsHandler(serverStatsHandler()), inproc.WithClientStatsHandler(clientStatsHandler()))
}

// New builds the server over the node's storage; it listens on nothing
// until Run.
func New(cfg Config, n *engine.Node, deps Deps, logger *slog.Logger) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	s := &Server{
		cfg:         cfg,
		n:           n,
		plane:       n.ClusterPlane(),
		deps:        deps,
		logger:      logger,
		incarnation: strconv.FormatInt(time.Now().UnixNano(), 36),
		listening:   make(chan struct{}),
	}
	s.metrics.newLatencies()
	var err error
	if cfg.AdminListen != "" {
		if err := s.setUpAdmin(n.Config().DataDir); err != nil {
			return nil, fmt.Errorf("node config: %w", err)
		}
	}
	if !cfg.ClientTLS.IsZero() {
		if s.clientTLS, err = pki.Load(cfg.ClientTLS, logger.With("plane", "client")); err != nil {
			return nil, fmt.Errorf("server.client_tls: %w", err)
		}
	}
	if s.clientAuth, err = newClientAuth(cfg, deps.GatewayToken, logger); err != nil {
		return nil, fmt.Errorf("node config: %w", err)
	}
	opts := append(serverLimits(),
		grpc.MaxRecvMsgSize(cfg.MaxMessageBytes),
		grpc.MaxSendMsgSize(cfg.MaxMessageBytes),
		grpc.ChainUnaryInterceptor(s.clientAuth.UnaryInterceptor),
		grpc.ChainStreamInterceptor(s.clientAuth.StreamInterceptor),
	)
	if telemetry.TracesExported() || telemetry.MetricsExported() {
		// As NewInProcess: without an exporter nobody sees the spans and
		// rpc metrics, which cost several percent of a node's CPU per
		// append.
		opts = append(opts, grpc.StatsHandler(serverStatsHandler()))
	}
	if s.clientTLS != nil {
		opts = append(opts, grpc.Creds(pki.Terminated()))
	}
	s.grpcServer = grpc.NewServer(opts...)
	s.streams = &streamService{eng: n.Engine, cluster: n.Cluster, metrics: &s.metrics, clusterID: cfg.ClusterID, selfAddr: cfg.Listen, leaderAddrs: map[uint64]string{}, draining: make(chan struct{})}
	for _, p := range n.Config().Peers {
		s.streams.leaderAddrs[p.ID] = p.ClientURL
	}
	if s.page, err = s.newStatusPage(); err != nil {
		return nil, fmt.Errorf("status page: %w", err)
	}
	s.coldgc = &coldGCService{cold: n.Cold}
	s.backup = &backupService{n: n, clusterID: cfg.ClusterID, maxMessage: cfg.MaxMessageBytes, now: time.Now}
	s.backupBudget = httpserver.NewBudget(cfg.InflightBodySize())
	if s.local = deps.InProcess; s.local == nil {
		s.local = NewInProcess(true)
	}
	for _, r := range []grpc.ServiceRegistrar{s.grpcServer, s.local} {
		streamv1.RegisterStreamServiceServer(r, s.streams)
		coldgcv1.RegisterColdGCServiceServer(r, s.coldgc)
		backupv1.RegisterBackupServiceServer(r, s.backup)
	}
	// Health and reflection are the network server's only: the roles of
	// this process know the node's state without asking.
	s.health = newNodeHealth(s.streams.draining, maxHealthWatchers)
	healthv1.RegisterHealthServer(s.grpcServer, s.health)
	registerReflection(s.grpcServer, cfg.reflection(cfg.Listen))
	// AdminService is served on the admin plane only (gRPC and its REST
	// mapping, adminHandler), never on the client plane.
	if cfg.AdminListen != "" {
		s.adminGRPC = s.newAdminGRPC()
	}
	return s, nil
}

// Conn is an in-process connection to the client plane's services: the
// roles that share this process (the all-in-one gateway, the cold-GC
// worker) call the node through it with the same generated clients, stats
// handlers (traces, metrics) and error statuses as over the network,
// without the network hop or marshalling (package inproc).
func (s *Server) Conn() grpc.ClientConnInterface { return s.local }

// Incarnation identifies this process run.
func (s *Server) Incarnation() string { return s.incarnation }

// Listening is closed once Run has bound the client, admin and cluster
// planes' listeners (the process's service manager hears that the node
// serves: services/app). It stays open when Run fails to bind one.
func (s *Server) Listening() <-chan struct{} { return s.listening }

// Run serves the client and admin planes until ctx ends, then drains them.
func (s *Server) Run(ctx context.Context) error {
	clientLn, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen on client plane %s: %w", s.cfg.Listen, err)
	}
	var adminLn net.Listener
	if s.cfg.AdminListen != "" {
		if adminLn, err = net.Listen("tcp", s.cfg.AdminListen); err != nil {
			_ = clientLn.Close()
			return fmt.Errorf("listen on admin plane %s: %w", s.cfg.AdminListen, err)
		}
	}
	var metricsLn net.Listener
	if s.cfg.MetricsListen != "" {
		if metricsLn, err = net.Listen("tcp", s.cfg.MetricsListen); err != nil {
			_ = clientLn.Close()
			if adminLn != nil {
				_ = adminLn.Close()
			}
			return fmt.Errorf("listen on metrics plane %s: %w", s.cfg.MetricsListen, err)
		}
	}
	var clusterLn net.Listener
	if s.plane != nil {
		if clusterLn, err = net.Listen("tcp", s.cfg.ClusterListen); err != nil {
			_ = clientLn.Close()
			if adminLn != nil {
				_ = adminLn.Close()
			}
			if metricsLn != nil {
				_ = metricsLn.Close()
			}
			return fmt.Errorf("listen on cluster plane %s: %w", s.cfg.ClusterListen, err)
		}
	}
	maxConns := s.cfg.maxConnections()
	clientLn = s.conns.limit(planeClient, clientLn, maxConns)
	if adminLn != nil {
		adminLn = s.conns.limit(planeAdmin, adminLn, maxConns)
	}
	if metricsLn != nil {
		metricsLn = s.conns.limit(planeMetrics, metricsLn, maxConns)
	}
	if clusterLn != nil {
		clusterLn = s.conns.limit(planeCluster, clusterLn, maxConns)
	}
	mux := listenmux.New(clientLn)
	if s.clientTLS != nil {
		mux = listenmux.NewTLS(clientLn, s.clientTLS.ServerConfig(tls.VerifyClientCertIfGiven), s.clientAuth.handshakeRefused)
	}
	errorLog := slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn)
	clientHTTP := s.cfg.HTTP.Server(http.MaxBytesHandler(s.httpHandler(), maxHTTPBodyBytes), errorLog)
	uiCtx, stopUI := context.WithCancel(ctx)
	defer stopUI()
	s.uiStop = uiCtx
	var (
		adminHTTP *http.Server
		adminMux  *listenmux.Mux
	)
	if adminLn != nil {
		h, err := s.adminHandler(ctx)
		if err != nil {
			_ = clientLn.Close()
			_ = adminLn.Close()
			if metricsLn != nil {
				_ = metricsLn.Close()
			}
			if clusterLn != nil {
				_ = clusterLn.Close()
			}
			return err
		}
		adminHTTP = s.cfg.HTTP.Server(withAdminTLS(h), errorLog) // bodies bounded per route (adminHandler)
		adminHTTP.ConnContext = adminConnContext
		// gRPC (AdminService, reflection) and HTTP share the admin
		// listener, TLS terminated before they are told apart.
		if s.adminTLS != nil {
			adminMux = listenmux.NewTLS(adminLn, s.adminTLS.ServerConfig(tls.VerifyClientCertIfGiven), s.adminHandshakeRefused)
		} else {
			adminMux = listenmux.New(adminLn)
		}
	}
	var wg sync.WaitGroup
	errc := make(chan error, 16)
	run := func(f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, grpc.ErrServerStopped) && !errors.Is(err, net.ErrClosed) {
				errc <- err
			}
		}()
	}
	run(mux.Serve)
	run(func() error { return s.page.Run(uiCtx) })
	run(func() error { return s.grpcServer.Serve(mux.GRPC()) })
	run(func() error { return clientHTTP.Serve(mux.HTTP()) })
	if adminHTTP != nil {
		run(adminMux.Serve)
		run(func() error { return adminHTTP.Serve(adminMux.HTTP()) })
		run(func() error { return s.adminGRPC.Serve(adminMux.GRPC()) })
	}
	var metricsHTTP *http.Server
	if metricsLn != nil {
		metricsHTTP = s.cfg.HTTP.Server(http.MaxBytesHandler(s.metricsHandler(), maxHTTPBodyBytes), errorLog)
		run(func() error { return metricsHTTP.Serve(metricsLn) })
	}
	var (
		clusterGRPC *grpc.Server
		clusterHTTP *http.Server
		clusterMux  *listenmux.Mux
	)
	if s.plane != nil {
		opts := append(append(serverLimits(), grpc.MaxRecvMsgSize(s.cfg.MaxMessageBytes), grpc.MaxSendMsgSize(s.cfg.MaxMessageBytes)), s.plane.ServerOptions()...)
		clusterGRPC = grpc.NewServer(opts...)
		s.plane.Register(clusterGRPC)
		if tlsCfg := s.plane.Transport().ServerTLS(); tlsCfg != nil {
			clusterMux = listenmux.NewTLS(clusterLn, tlsCfg, s.plane.Transport().HandshakeRefused)
		} else {
			clusterMux = listenmux.New(clusterLn)
		}
		shed := http.NewServeMux()
		shed.HandleFunc("GET /__ursula/leadership-shed", s.serveShed)
		clusterHTTP = s.cfg.HTTP.Server(http.MaxBytesHandler(shed, maxHTTPBodyBytes), errorLog)
		run(clusterMux.Serve)
		run(func() error { return clusterGRPC.Serve(clusterMux.GRPC()) })
		run(func() error { return clusterHTTP.Serve(clusterMux.HTTP()) })
	}
	s.logger.Info("node listening", "client", clientLn.Addr().String(), "admin", s.cfg.AdminListen, "cluster", s.cfg.ClusterListen, "metrics", s.cfg.MetricsListen,
		"client_grpc_reflection", s.cfg.reflection(s.cfg.Listen).String(), "admin_grpc_reflection", s.cfg.reflection(s.cfg.AdminListen).String())
	close(s.listening)
	go func() {
		if err := s.n.WaitReady(ctx); err == nil {
			s.setReady(true)
			s.logger.Info("node ready")
		}
	}()
	healthCtx, stopHealth := context.WithCancel(ctx)
	defer stopHealth()
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.watchHealth(healthCtx)
	}()

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	s.stopping.Store(true)
	s.setReady(false)
	stopHealth()
	// The status page stops reading and ends its live connections, so
	// that the admin plane's graceful stop does not wait for them.
	stopUI()
	if s.plane != nil {
		s.handOff()
	}
	// Long-lived calls (subscriptions, waiting reads) end now, so that
	// the graceful stop below does not wait for them.
	s.streams.drain()
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stopped := make(chan struct{})
	go func() { s.grpcServer.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-shutdownCtx.Done():
		s.grpcServer.Stop()
	}
	_ = clientHTTP.Shutdown(shutdownCtx)
	if adminHTTP != nil {
		adminStopped := make(chan struct{})
		go func() { s.adminGRPC.GracefulStop(); close(adminStopped) }()
		select {
		case <-adminStopped:
		case <-shutdownCtx.Done():
			s.adminGRPC.Stop()
		}
		_ = adminHTTP.Shutdown(shutdownCtx)
		_ = adminMux.Close()
	}
	if metricsHTTP != nil {
		_ = metricsHTTP.Shutdown(shutdownCtx)
	}
	_ = mux.Close()
	if clusterGRPC != nil {
		clusterGRPC.Stop()
		_ = clusterHTTP.Close()
		_ = clusterMux.Close()
	}
	wg.Wait()
	if s.audit != nil {
		s.audit.close()
	}
	return runErr
}

// Limits of the node's gRPC servers.
const (
	// maxConcurrentStreams bounds the calls in flight on one connection
	// (a gateway multiplexes its long-polls and subscriptions on a few).
	maxConcurrentStreams = 16384
	// connectionTimeout bounds a new connection's handshakes.
	connectionTimeout = 10 * time.Second
)

// serverLimits are the resource bounds every gRPC server of the node
// sets: streams per connection, handshake time, and keepalive both ways
// (pings no more often than every 5 s from clients; a connection idle for
// 10 minutes, or whose peer does not answer a ping within 10 s, is
// closed).
func serverLimits() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxConcurrentStreams(maxConcurrentStreams),
		grpc.ConnectionTimeout(connectionTimeout),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: 10 * time.Minute, Time: 30 * time.Second, Timeout: 10 * time.Second}),
	}
}

func unixSeconds(t time.Time) float64 {
	if t.IsZero() {
		return 0
	}
	return float64(t.Unix())
}

// handOff is the first step of a graceful voter shutdown: mark the node
// drained and hand its leaderships to eligible voters while the transport
// stays up, waiting up to five seconds for the leaderships to move.
func (s *Server) handOff() {
	c := s.n.Cluster
	c.SetDraining(true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if c.HandOffAll(ctx) {
		s.logger.Info("leaderships handed off")
		return
	}
	s.logger.Warn("leadership handoff incomplete at shutdown", "still_leading", c.LeaderCount())
}

func (s *Server) setReady(v bool) {
	s.readyMu.Lock()
	s.ready = v
	s.readyMu.Unlock()
	s.refreshHealth()
}

// leaderlessGrace is how long a group this node saw led may go without a
// known leader before readiness says raft_replica_unready: the maximum
// election timeout, within which a routine leadership change completes.
const leaderlessGrace = 3 * time.Second

// Readiness reasons: why this node does not serve (GET /__ursula/ready
// answers 503 with one of them, on the client and admin planes alike). A
// refused peer of another cluster never changes readiness.
const (
	// ReasonStarting: the engine has not yet recovered its journals, seen
	// a leader in every group, or applied what its led groups committed.
	ReasonStarting = "starting"
	// ReasonShuttingDown: a graceful shutdown began.
	ReasonShuttingDown = "shutting_down"
	// ReasonAwaitingRebuild: this node lost its data and waits for group
	// leaders to rebuild it (see Rejoining a wiped node).
	ReasonAwaitingRebuild = "awaiting_rebuild"
	// ReasonLearner: this node is a learner (catching up) in some group.
	ReasonLearner = "learner_catching_up"
	// ReasonNoLeader: some group has no leader this node knows of (the
	// seed's raft_replica_unready; raft_maintenance.group_issues in the
	// metrics names the groups).
	ReasonNoLeader = "raft_replica_unready"
	// ReasonRecoveryGateClosed: some group is behind the recovery gate
	// (the previous run may have lost the unsynced tail of the journals)
	// and has not applied its leader's barrier yet.
	ReasonRecoveryGateClosed = "recovery_gate_closed"
	// ReasonRecoveryStalled: a gated group has had no barrier and applied
	// nothing for 30 s: only an operator can recover it.
	ReasonRecoveryStalled = "recovery_stalled"
	// ReasonFeatureLevelUnsupported: some group was raised to a feature
	// level this build does not know; the node stopped applying it (the
	// ready document's unsupported_feature_level and detail name the
	// level and the group). Run a release that knows the level.
	ReasonFeatureLevelUnsupported = "feature_level_unsupported"
)

func (s *Server) readiness() *adminv1.GetReadyResponse {
	s.readyMu.Lock()
	ready := s.ready
	s.readyMu.Unlock()
	r := &adminv1.GetReadyResponse{ClusterId: s.cfg.ClusterID, ProcessIncarnation: s.incarnation, PeerClusterMismatches: []string{}}
	for _, m := range s.mismatches() {
		r.PeerClusterMismatches = append(r.PeerClusterMismatches, fmt.Sprintf("node %d cluster %s", m.NodeID, m.ClusterID))
	}
	r.Reason = s.notReadyReason(ready)
	r.Ready = r.Reason == ""
	return r
}

// notReadyReason returns why the node does not serve, or "".
func (s *Server) notReadyReason(started bool) string {
	return readinessReason(s.stopping.Load(), started, len(s.n.Cluster.RejoinPending()), s.n.Cluster.GateStates(), s.groupStatuses(), s.n.Config().NodeID, time.Now())
}

// groupStatuses is every group's status on this node.
func (s *Server) groupStatuses() []multiraft.GroupStatus {
	groups := make([]multiraft.GroupStatus, s.n.Cluster.GroupCount())
	for g := range groups {
		groups[g] = s.n.Cluster.Status(uint32(g))
	}
	return groups
}

// gateLists lists the gated groups, and those of them stalled (JSON
// arrays, sorted).
func (s *Server) gateLists() (closed, stalled []any) {
	gates := s.n.Cluster.GateStates()
	ids := make([]uint32, 0, len(gates))
	for g := range gates {
		ids = append(ids, g)
	}
	slices.Sort(ids)
	closed, stalled = []any{}, []any{}
	for _, g := range ids {
		closed = append(closed, float64(g))
		if gates[g] == cluster.GateStalled {
			stalled = append(stalled, float64(g))
		}
	}
	return closed, stalled
}

// readinessReason decides readiness from what the node knows: whether it
// is stopping, whether its engine reported ready once, how many groups
// still wait to rebuild it, and each group's status.
func readinessReason(stopping, started bool, rejoinPending int, gates map[uint32]cluster.GateState, groups []multiraft.GroupStatus, self uint64, now time.Time) string {
	if stopping {
		return ReasonShuttingDown
	}
	// A halted group never applies again in this run: nothing else this
	// node could report would change that.
	if _, _, _, halted := haltedLevel(groups); halted {
		return ReasonFeatureLevelUnsupported
	}
	// A gated node may never see a leader (a majority lost its tail): the
	// gate says why, before "starting" would.
	for _, st := range gates {
		if st == cluster.GateStalled {
			return ReasonRecoveryStalled
		}
	}
	if len(gates) > 0 {
		return ReasonRecoveryGateClosed
	}
	// A wiped replica waits for its leaders' rebuild before it can ever
	// report started: say so.
	switch {
	case rejoinPending > 0:
		return ReasonAwaitingRebuild
	case !started:
		return ReasonStarting
	}
	for _, st := range groups {
		if slices.Contains(st.Learners, self) {
			return ReasonLearner
		}
		// A leadership change (a transfer, a new election) leaves a group
		// without a known leader for a moment: readiness does not flap
		// for it, only for a group without one for leaderlessGrace.
		if st.LeaderID == 0 && (st.LeaderLostAt.IsZero() || now.Sub(st.LeaderLostAt) >= leaderlessGrace) {
			return ReasonNoLeader
		}
	}
	return ""
}

func (s *Server) metricsSnapshot() map[string]any {
	// Bounds the questions put to busy shard workers (leads_live).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m := s.metrics.snapshot(ctx, s.n, s.cfg.ClusterID, s.incarnation)
	m["node_id"] = float64(s.n.Config().NodeID)
	m["peer_cluster_mismatches"] = s.mismatchList()
	m["commit_stall_interventions"] = float64(s.n.Cluster.CommitStalls())
	closed, stalled := s.gateLists()
	m["recovery_gates"] = map[string]any{"closed": closed, "stalled": stalled}
	m["recovery_gates_closed"] = float64(len(closed))
	m["recovery_gates_stalled"] = float64(len(stalled))
	m["client_auth_refusals"] = float64(s.clientAuth.refusals.Load())
	m["admin_auth_refusals"] = float64(s.adminAuthRefusals.Load())
	s.conns.addMetrics(m, s.cfg.maxConnections())
	// When each plane's certificate expires (Unix seconds; 0 without TLS),
	// for alerts before it does.
	var clusterNotAfter time.Time
	if s.plane != nil {
		clusterNotAfter = s.plane.Transport().CertificateNotAfter()
	}
	m["cluster_tls_cert_not_after_seconds"] = unixSeconds(clusterNotAfter)
	m["client_tls_cert_not_after_seconds"] = unixSeconds(s.clientTLS.NotAfterOrZero())
	m["admin_tls_cert_not_after_seconds"] = unixSeconds(s.adminTLS.NotAfterOrZero())
	m["client_tls_handshake_refusals"] = float64(s.clientAuth.handshakeRefusals.Load())
	if f := s.deps.ExtraMetrics; f != nil {
		f(m)
	}
	m["wal_recovery"] = s.n.WALRecovery()
	m["leadership_shed_state"] = s.n.Cluster.ShedState().GetState()
	fl := s.n.Cluster.LocalFeatureLevel()
	m["feature_level"] = float64(minLevel(fl.GroupLevels))
	m["feature_level_max_supported"] = float64(fl.MaxLevel)
	m["feature_level_halted_groups"] = float64(len(fl.HaltedGroups))
	if s.plane != nil {
		// The transport's counters carry their metric names as JSON tags.
		if raw, err := json.Marshal(s.plane.Transport().Stats()); err == nil {
			var tm map[string]any
			if json.Unmarshal(raw, &tm) == nil {
				for k, v := range tm {
					m[k] = v
				}
			}
		}
	} else {
		m["raft_grpc_peer_cluster_refusals"] = float64(0)
	}
	return m
}

// httpHandler serves /__ursula/{metrics,ready,usage} on the client plane.
func (s *Server) httpHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /__ursula/metrics", s.serveMetrics)
	mux.HandleFunc("GET /__ursula/ready", s.serveReady)
	mux.HandleFunc("GET /__ursula/usage", s.serveUsage)
	return mux
}

// metricsHandler serves the metrics plane (server.metrics_listen): what a
// remote Prometheus or load balancer reads, and nothing that changes
// anything: GET /__ursula/prometheus (the process's metrics), GET
// /__ursula/metrics (the JSON document the client plane also serves: no
// secret in it) and GET /__ursula/ready. Every other request is 404, or
// 405 for another method on those paths; there are no profiles, audit log
// or per-bucket usage here.
func (s *Server) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /__ursula/prometheus", s.servePrometheus)
	mux.HandleFunc("GET /__ursula/metrics", s.serveMetrics)
	mux.HandleFunc("GET /__ursula/ready", s.serveReady)
	return mux
}

func (s *Server) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.metricsSnapshot())
}

func (s *Server) serveReady(w http.ResponseWriter, _ *http.Request) {
	r := s.readiness()
	code := http.StatusOK
	if !r.GetReady() {
		code = http.StatusServiceUnavailable
	}
	_, stalled := s.gateLists()
	doc := map[string]any{
		"ready":                   r.GetReady(),
		"reason":                  r.GetReason(),
		"recovery_stalled_groups": stalled,
		"cluster_id":              r.GetClusterId(),
		"peer_cluster_mismatches": s.mismatchList(),
		"process_incarnation":     r.GetProcessIncarnation(),
	}
	if r.GetReason() == ReasonFeatureLevelUnsupported {
		if g, level, detail, ok := haltedLevel(s.groupStatuses()); ok {
			doc["unsupported_feature_level"], doc["max_feature_level"], doc["halted_group"], doc["detail"] = level, stream.MaxFeatureLevel, g, detail
		}
	}
	writeJSON(w, code, doc)
}

// adminHandler serves the admin plane: the REST surface of AdminService
// generated by grpc-gateway, readiness (which answers 503 when not ready
// and renders peer mismatches as on the client plane), the recovery and
// backup routes and profiles, all behind adminGuard (token, process
// incarnation). Request bodies are bounded per route: 1 MiB, but group
// objects on the backup routes (backupBody: max_message_bytes).
func (s *Server) adminHandler(ctx context.Context) (http.Handler, error) {
	gw, err := s.adminGateway(ctx)
	if err != nil {
		return nil, err
	}
	small := func(h http.HandlerFunc) http.Handler { return http.MaxBytesHandler(h, maxHTTPBodyBytes) }
	mux := http.NewServeMux()
	mux.Handle("GET /__ursula/ready", small(s.serveReady))
	mux.Handle("GET /__ursula/prometheus", small(s.servePrometheus))
	mux.Handle("GET /__ursula/usage", small(s.serveUsage))
	mux.Handle("GET /__ursula/audit", small(s.serveAudit))
	mux.Handle("GET /__ursula/openapi.json", small(s.serveOpenAPI))
	mux.Handle("POST /__ursula/raft/{group}/recovery/accept-unsynced-loss", small(s.serveAcceptUnsyncedLoss))
	mux.Handle("GET /__ursula/feature-level", small(s.serveFeatureLevel))
	// The mux redirects /__ursula/ui to /__ursula/ui/ (statuspage.Prefix).
	mux.Handle("GET /__ursula/ui/", statuspage.WithStop(s.page, s.uiStop))
	mux.Handle("POST /__ursula/feature-level", small(s.serveRaiseFeatureLevel))
	s.featureTestRoutes(mux, small)
	s.backupRoutes(mux)
	if s.cfg.AdminPprof {
		// Profiles cost CPU and reveal memory: only when asked for, and
		// behind the token (see pprofGuard).
		mux.Handle("/debug/pprof/", s.pprofGuard(small(pprof.Index)))
		mux.Handle("/debug/pprof/profile", s.pprofGuard(small(pprof.Profile)))
		mux.Handle("/debug/pprof/trace", s.pprofGuard(small(pprof.Trace)))
		mux.Handle("/debug/pprof/symbol", s.pprofGuard(small(pprof.Symbol)))
	}
	mux.Handle("/", http.MaxBytesHandler(gw, maxHTTPBodyBytes))
	return s.adminGuard(mux), nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *Server) mismatches() []transport.Mismatch {
	if s.plane == nil {
		return nil
	}
	return s.plane.Transport().PeerClusterMismatches()
}

// mismatchList renders peer_cluster_mismatches for JSON documents.
func (s *Server) mismatchList() []any {
	out := []any{}
	for _, m := range s.mismatches() {
		out = append(out, map[string]any{"node_id": m.NodeID, "cluster_id": m.ClusterID, "address": m.Address, "direction": m.Direction})
	}
	return out
}
