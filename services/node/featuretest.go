//go:build featuretest

package node

import (
	"net/http"

	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
	"github.com/ursula/ursula/storage/stream"
)

// featureTestRoutes serves the test-only feature of a build made with
// -tags featuretest (storage/stream featuretest.go), for the e2e upgrade
// test:
//
//   - POST /__ursula/featuretest/probe proposes a FeatureProbe in every
//     group this node leads, each behind the feature-level gate: a group
//     below the probe's level answers 409 FEATURE_LEVEL_UNSUPPORTED and
//     nothing is proposed in it;
//   - GET /__ursula/featuretest/probe answers the probes each of this
//     node's replicas applied.
func (s *Server) featureTestRoutes(mux *http.ServeMux, small func(http.HandlerFunc) http.Handler) {
	mux.Handle("POST /__ursula/featuretest/probe", small(s.serveFeatureProbe))
	mux.Handle("GET /__ursula/featuretest/probe", small(s.serveFeatureProbes))
}

func (s *Server) serveFeatureProbe(w http.ResponseWriter, r *http.Request) {
	c := s.n.Cluster
	probed := []uint32{}
	for g := range uint32(c.GroupCount()) {
		if !c.Leads(g) {
			continue
		}
		err := c.RequireFeatureLevel(g, stream.FeatureProbeLevel, "a feature probe")
		if err == nil {
			_, err = c.Propose(r.Context(), g, &storagev1.Command{Op: &storagev1.Command_FeatureProbe{FeatureProbe: &storagev1.FeatureProbe{Note: "e2e"}}})
		}
		if err != nil {
			adminFail(w, err)
			return
		}
		probed = append(probed, g)
	}
	writeJSON(w, http.StatusOK, map[string]any{"probed_groups": probed})
}

func (s *Server) serveFeatureProbes(w http.ResponseWriter, _ *http.Request) {
	c := s.n.Cluster
	applied := make([]uint64, c.GroupCount())
	for g := range applied {
		applied[g] = c.Machine(uint32(g)).FeatureProbes()
	}
	writeJSON(w, http.StatusOK, map[string]any{"applied": applied})
}
