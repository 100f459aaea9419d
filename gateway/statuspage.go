package gateway

import (
	"context"
	"net"
	"net/http"
	"strings"

	"github.com/ursula/ursula/services/platform/errcode"
)

// statusPagePrefix is the path of the cluster status page.
const statusPagePrefix = ownPrefix + "ui"

// isStatusPage reports whether path is the status page or below it.
func isStatusPage(path string) bool {
	return path == statusPagePrefix || strings.HasPrefix(path, statusPagePrefix+"/")
}

// serveStatusPage serves /__ursula/ui/... as Config.StatusPage allows.
// Its answers never carry the CORS headers the stream API does: another
// origin must not read the cluster's internals from a browser that can
// reach the gateway. Live connections end when the gateway stops.
func (g *Gateway) serveStatusPage(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	delete(h, "Access-Control-Allow-Origin")
	delete(h, "Access-Control-Expose-Headers")
	if g.cfg.StatusUI == nil || g.cfg.StatusPage == StatusPageOff {
		notFound(w, "the status page is off (gateway.status_page)")
		return
	}
	if g.cfg.StatusPage != StatusPageOn && !localRequest(r) {
		writeDomainError(w, &errcode.Error{Code: errcode.PermissionDenied, Message: `the status page answers clients on this host only (gateway.status_page = "loopback")`})
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(g.stopCtx, cancel)
	defer stop()
	g.cfg.StatusUI.ServeHTTP(w, r.WithContext(ctx))
}

// localRequest reports whether r comes from this host: a loopback peer
// address, a loopback Host (a page of another site that rebinds its name
// to 127.0.0.1 names its own host) and no forwarding header (a proxy on
// this host relays other hosts' requests).
func localRequest(r *http.Request) bool {
	if r.Header.Get("Forwarded") != "" || r.Header.Get("X-Forwarded-For") != "" {
		return false
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return false
	}
	return loopbackHost(r.Host)
}

// loopbackHost reports whether a Host header names this host: localhost or
// a loopback address, with or without a port.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
