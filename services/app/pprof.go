package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/ursula/ursula/services/platform/lifecycle"
)

// pprofRole serves the process's Go profiles on addr, a loopback address
// (gateway.pprof_listen, checked by the gateway's Validate): the gateway
// process has no admin plane, and its CPU per request is measured with
// them.
func pprofRole(addr string, logger *slog.Logger) lifecycle.Role {
	return lifecycle.Role{Name: "pprof", Run: func(ctx context.Context) error {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		lis, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("gateway.pprof_listen: %w", err)
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		logger.Info("serving Go profiles", "addr", lis.Addr().String())
		done := make(chan error, 1)
		go func() { done <- srv.Serve(lis) }()
		select {
		case <-ctx.Done():
			_ = srv.Close()
			<-done
			return nil
		case err := <-done:
			if errors.Is(err, http.ErrServerClosed) {
				return nil
			}
			return fmt.Errorf("gateway.pprof_listen: %w", err)
		}
	}}
}
