package node

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/ursula/ursula/internal/pki"
	"github.com/ursula/ursula/services/platform/statuspage"
)

// newStatusPage builds the cluster status page of this node: itself read
// in process, every other configured peer over its client plane's HTTP
// side (/__ursula/{metrics,ready} answer without credentials; under TLS
// the peer must prove a node identity of the configured CA).
func (s *Server) newStatusPage() (*statuspage.Page, error) {
	self := s.n.Config().NodeID
	targets := []statuspage.Target{statuspage.FuncTarget(s.observeSelf)}
	var client *http.Client
	scheme := "http://"
	for _, p := range s.n.Config().Peers {
		if p.ID == self {
			continue
		}
		if client == nil {
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.MaxIdleConnsPerHost = 2
			if s.clientTLS != nil {
				cfg := s.clientTLS.ClientConfig(pki.ExpectAnyNode)
				// Anonymous: the node's certificate proves a node, not a
				// client role, and these reads need none.
				cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &tls.Certificate{}, nil }
				cfg.NextProtos = []string{"http/1.1"}
				tr.TLSClientConfig = cfg
				scheme = "https://"
			}
			client = &http.Client{Transport: tr, Timeout: statuspage.DefaultTimeout}
		}
		addr := p.ClientURL
		if addr == "" {
			addr = fmt.Sprintf("node %d (no client_url)", p.ID)
		}
		targets = append(targets, statuspage.HTTPTarget{Address: addr, NodeID: p.ID, BaseURL: scheme + p.ClientURL, Client: client})
	}
	return statuspage.New(statuspage.Config{Source: fmt.Sprintf("node %d", self)}, statuspage.Fixed(targets...), s.logger.With("component", "statuspage"))
}

// observeSelf reads this node's metrics document and readiness in process.
func (s *Server) observeSelf(context.Context) statuspage.Observation {
	addr := s.cfg.Listen
	for _, p := range s.n.Config().Peers {
		if p.ID == s.n.Config().NodeID && p.ClientURL != "" {
			addr = p.ClientURL
		}
	}
	o := statuspage.Observation{Address: addr}
	// The snapshot bounds its own questions to busy shard workers (2 s).
	raw, err := json.Marshal(s.metricsSnapshot())
	if err == nil {
		o.Metrics, err = statuspage.DecodeMetrics(raw)
	}
	if err != nil {
		o.Err = err
		return o
	}
	r := s.readiness()
	o.Ready = &statuspage.Readiness{Ready: r.GetReady(), Reason: r.GetReason()}
	return o
}

// StatusPage serves the cluster status page (/__ursula/ui/...) as this
// node sees it: the admin plane serves it behind its guard, and the
// all-in-one gateway serves the same page.
func (s *Server) StatusPage() http.Handler { return s.page }
