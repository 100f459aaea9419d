package app

import (
	"testing"

	"github.com/ursula/ursula/gateway"
)

// TestPprofListenIsLoopback: the gateway's profiles are served on a
// loopback address only.
func TestPprofListenIsLoopback(t *testing.T) {
	tests := []struct {
		addr string
		ok   bool
	}{
		{"", true},
		{"127.0.0.1:4499", true},
		{"[::1]:4499", true},
		{"0.0.0.0:4499", false},
		{"10.0.0.1:4499", false},
		{"localhost:4499", false},
		{"127.0.0.1", false},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			err := (&gateway.Config{PprofListen: tt.addr}).Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate(pprof_listen %q) = %v, want ok %v", tt.addr, err, tt.ok)
			}
		})
	}
}
