package node

import (
	"net"
	"sync/atomic"

	"github.com/ursula/ursula/services/platform/httpserver"
)

// The node's planes, each with its own connection cap
// (server.max_connections).
const (
	planeClient = iota
	planeAdmin
	planeMetrics
	planeCluster
	planeCount
)

var planeNames = [planeCount]string{"client", "admin", "metrics", "cluster"}

// planeConns holds the caps of the planes Run serves, for the metrics (a
// plane not served has none). A connection beyond a cap is closed as it is
// accepted, before its TLS handshake or its first byte is read: without
// the cap every connection (a handshake that never finishes included)
// costs a goroutine and its buffers until its deadline, and callers alone
// decide how many descriptors and how much memory the node holds.
type planeConns [planeCount]atomic.Pointer[httpserver.ConnLimiter]

// limit caps ln at max connections and records the cap as plane's.
func (p *planeConns) limit(plane int, ln net.Listener, max int) net.Listener {
	l := httpserver.LimitConnections(ln, max, nil)
	p[plane].Store(l)
	return l
}

// addMetrics adds each plane's connections held and refused, and the cap.
func (p *planeConns) addMetrics(m map[string]any, max int) {
	for i, name := range planeNames {
		var active, refused float64
		if l := p[i].Load(); l != nil {
			active, refused = float64(l.Active()), float64(l.Refused())
		}
		m[name+"_connections"] = active
		m[name+"_connections_refused"] = refused
	}
	m["max_connections_per_plane"] = float64(max)
}
