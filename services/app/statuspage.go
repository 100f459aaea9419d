package app

import (
	"fmt"
	"log/slog"
	"net/http"

	"github.com/ursula/ursula/gateway/upstream"
	"github.com/ursula/ursula/internal/pki"
	"github.com/ursula/ursula/services/platform/statuspage"
)

// gatewayStatusPage builds the status page of a gateway that reaches its
// nodes over the network: it reads /__ursula/{metrics,ready} on the client
// plane of every node the router knows, over TLS when the upstream
// connections use it (the nodes must prove a node identity; no client
// certificate is presented, these reads need none).
func gatewayStatusPage(cp pki.ClientPlane, router *upstream.Router, logger *slog.Logger) (*statuspage.Page, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 2
	scheme := "http://"
	if !cp.TLS.IsZero() {
		src, err := pki.Load(cp.TLS, logger.With("component", "pki", "plane", "client"))
		if err != nil {
			return nil, fmt.Errorf("status page: %w", err)
		}
		cfg := src.ClientConfig(pki.ExpectAnyNode)
		cfg.NextProtos = []string{"http/1.1"}
		tr.TLSClientConfig = cfg
		scheme = "https://"
	}
	client := &http.Client{Transport: tr, Timeout: statuspage.DefaultTimeout}
	targets := func() []statuspage.Target {
		addrs := router.NodeAddrs()
		out := make([]statuspage.Target, 0, len(addrs))
		for _, a := range addrs {
			out = append(out, statuspage.HTTPTarget{Address: a, BaseURL: scheme + a, Client: client})
		}
		return out
	}
	return statuspage.New(statuspage.Config{Source: "gateway"}, targets, logger.With("component", "statuspage"))
}
