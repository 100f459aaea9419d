package app

import "testing"

func TestTargetForName(t *testing.T) {
	tests := []struct{ arg0, want string }{
		{"ursula", TargetAll},
		{"/usr/local/bin/ursula", TargetAll},
		{"/usr/local/bin/ursula-node", TargetNode},
		{"ursula-gateway", TargetGateway},
		{"./bin/ursula-coldgc", TargetColdGC},
		{"/usr/bin/ursula-backup", TargetBackup},
		{"ursulactl", TargetAll},
		{"ursula-nodes", TargetAll},
		{"/usr/local/bin/ursula-node/", TargetNode},
		{"", TargetAll},
	}
	for _, tc := range tests {
		t.Run(tc.arg0, func(t *testing.T) {
			if got := TargetForName(tc.arg0); got != tc.want {
				t.Fatalf("TargetForName(%q) = %q, want %q", tc.arg0, got, tc.want)
			}
		})
	}
}

// Every per-role binary's name leads back to its target, and the ursula
// binary run under that name reports it (-version, -h) and exports it as
// service.name.
func TestTargetForNameRoundTrip(t *testing.T) {
	for target, binary := range serviceNames {
		t.Run(binary, func(t *testing.T) {
			arg0 := "/usr/local/bin/" + binary
			got := TargetForName(arg0)
			if got != target {
				t.Fatalf("TargetForName(%q) = %q, want %q", arg0, got, target)
			}
			if name := binaryName(arg0, got); name != binary {
				t.Errorf("-version names %q, want %q", name, binary)
			}
			if name := serviceNames[got]; name != binary {
				t.Errorf("service.name %q, want %q", name, binary)
			}
		})
	}
}
