package pki

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRootManagedSecretFiles checks the files root manages for a process
// that is not root (a Kubernetes Secret mounted for the pod's fsGroup):
// readable by their group is allowed, writable by it or readable by
// others is not. The process's user is replaced; the files must be
// root's, so the test runs as root only.
func TestRootManagedSecretFiles(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs files owned by root: run as root")
	}
	p := newTestPKI(t)
	f := p.issue(t, "node1", NodeIdentity(1))
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte(strings.Repeat("k", 40)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		euid    int
		mode    os.FileMode
		wantErr string // "" accepts
	}{
		{"a Kubernetes Secret (0440)", 65532, 0o440, ""},
		{"root's file for a group (0640)", 65532, 0o640, ""},
		{"own file", 65532, 0o600, ""},
		{"group writable", 65532, 0o660, "group or others"},
		{"others readable", 65532, 0o444, "group or others"},
		{"root process, group readable", 0, 0o440, "group or others"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			geteuid = func() int { return tc.euid }
			defer func() { geteuid = os.Geteuid }()
			for _, name := range []string{token, f.KeyFile} {
				if err := os.Chmod(name, tc.mode); err != nil {
					t.Fatal(err)
				}
			}
			defer os.Chmod(f.KeyFile, 0o600)
			_, terr := ReadTokenFile(token)
			oerr := CheckSecretFileOwner(token)
			_, kerr := Load(f, nil)
			for what, err := range map[string]error{"token": terr, "key": kerr} {
				if tc.wantErr == "" && err != nil {
					t.Errorf("%s refused: %v", what, err)
				}
				if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) && !strings.Contains(err.Error(), "chmod 600")) {
					t.Errorf("%s: %v, want a refusal about %q", what, err, tc.wantErr)
				}
			}
			if oerr != nil {
				t.Errorf("root's token file refused as not the process's: %v", oerr)
			}
		})
	}
	t.Run("another user's file", func(t *testing.T) {
		geteuid = func() int { return 65532 }
		defer func() { geteuid = os.Geteuid }()
		if err := os.Chown(token, 1000, 1000); err != nil {
			t.Fatal(err)
		}
		if err := CheckSecretFileOwner(token); err == nil || !strings.Contains(err.Error(), "owned by uid 1000") {
			t.Fatalf("CheckSecretFileOwner = %v, want a refusal naming uid 1000", err)
		}
	})
}
