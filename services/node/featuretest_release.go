//go:build !featuretest

package node

import "net/http"

// featureTestRoutes adds nothing: only a build made with -tags featuretest
// has the test-only feature's routes (featuretest.go).
func (s *Server) featureTestRoutes(*http.ServeMux, func(http.HandlerFunc) http.Handler) {}
