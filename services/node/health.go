package node

import (
	"context"
	"time"

	"google.golang.org/grpc/health"
	healthv1 "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/ursula/ursula/services/platform/errcode"
	"github.com/ursula/ursula/services/platform/grpcerr"
)

// healthServiceName is grpc.health.v1.Health, which needs no credentials
// on the client plane (clientAuth).
var healthServiceName = healthv1.Health_ServiceDesc.ServiceName

// healthRefreshInterval is how often the node recomputes its readiness
// for grpc.health.v1 besides the moments it changes it itself (ready,
// shutting down): readiness also follows the groups' leaders and recovery
// gates, which change on their own.
const healthRefreshInterval = time.Second

// maxHealthWatchers bounds the Watch calls open at once: health needs no
// credentials, so its long-lived calls are bounded apart from the
// authenticated ones.
const maxHealthWatchers = 1024

// nodeHealth is the client plane's grpc.health.v1 service: the overall
// service ("") and ursula.stream.v1.StreamService are SERVING exactly
// when the node is ready (the readiness of GET /__ursula/ready), and
// NOT_SERVING otherwise; a caller's Watch sees each change. Watch calls
// end when the node drains, so that they do not hold its graceful stop;
// at most maxWatchers are open at once (more answer LIMIT_EXCEEDED).
type nodeHealth struct {
	*health.Server
	draining <-chan struct{}
	watchers chan struct{} // one token per open Watch
}

func newNodeHealth(draining <-chan struct{}, maxWatchers int) *nodeHealth {
	h := &nodeHealth{Server: health.NewServer(), draining: draining, watchers: make(chan struct{}, maxWatchers)}
	h.set(false)
	return h
}

// set records the node's readiness.
func (h *nodeHealth) set(ready bool) {
	st := healthv1.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthv1.HealthCheckResponse_SERVING
	}
	h.SetServingStatus("", st)
	h.SetServingStatus(streamServiceName, st)
}

// Watch implements grpc.health.v1.Health, ending the call when the node
// drains.
func (h *nodeHealth) Watch(req *healthv1.HealthCheckRequest, stream healthv1.Health_WatchServer) error {
	select {
	case h.watchers <- struct{}{}:
		defer func() { <-h.watchers }()
	default:
		return grpcerr.ToStatus(errcode.New(errcode.LimitExceeded, "%d health watchers are open, the most this node serves: use Check", cap(h.watchers)))
	}
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	go func() {
		select {
		case <-h.draining:
			cancel()
		case <-ctx.Done():
		}
	}()
	return h.Server.Watch(req, &watchStream{Health_WatchServer: stream, ctx: ctx})
}

// watchStream is a Watch stream with a context that also ends on drain.
type watchStream struct {
	healthv1.Health_WatchServer
	ctx context.Context
}

func (w *watchStream) Context() context.Context { return w.ctx }

// refreshHealth sets grpc.health.v1 from the node's readiness now.
func (s *Server) refreshHealth() {
	s.health.set(s.readiness().GetReady())
}

// watchHealth refreshes grpc.health.v1 every healthRefreshInterval until
// ctx ends.
func (s *Server) watchHealth(ctx context.Context) {
	t := time.NewTicker(healthRefreshInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.refreshHealth()
		}
	}
}
