package ursulactl

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/ursula/ursula/internal/pki"
)

// certCommand manages a cluster CA and the certificates of its processes:
// each proves one identity (urn:ursula:node:<id> or urn:ursula:role:<role>,
// package pki) for the cluster plane's mutual TLS and the client plane.
// It needs no manifest and talks to no node.
func certCommand(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cert",
		Short: "Create a cluster CA and the certificates of nodes and roles",
		Long: `cert creates the certificates Ursula's planes authenticate with, in one directory:
ca.crt and ca.key (the cluster CA), and <name>.crt and <name>.key per process.
Keys are written with mode 600. An existing CA is never overwritten; an issued
certificate replaces the previous one atomically, and nodes pick it up without
a restart (see docs/security.md, "Rotating certificates").`,
	}
	cmd.AddCommand(certInitCommand(a), certIssueCommand(a), certDevClusterCommand(a))
	return cmd
}

func certInitCommand(a *app) *cobra.Command {
	var (
		dir  string
		name string
		days int
	)
	cmd := &cobra.Command{
		Use:   "init",
		Short: "Create the cluster CA (ca.crt, ca.key) in --dir",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, made, err := ensureCA(dir, name, days)
			if err != nil {
				return err
			}
			if !made {
				return fmt.Errorf("%s already holds a CA; it is kept", dir)
			}
			ca := filepath.Join(dir, "ca.crt")
			if a.o.json {
				return a.emit(map[string]any{"ca": ca, "created": true})
			}
			fmt.Fprintf(a.env.Stdout, "created the CA %s\n", ca)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory of the CA and certificates")
	cmd.Flags().StringVar(&name, "name", "ursula-cluster", "the CA's common name")
	cmd.Flags().IntVar(&days, "days", 3650, "validity in days")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

func certIssueCommand(a *app) *cobra.Command {
	var (
		dir   string
		node  uint64
		role  string
		name  string
		hosts []string
		days  int
	)
	cmd := &cobra.Command{
		Use:   "issue",
		Short: "Issue the certificate of a node (--node N) or a role (--role gateway|coldgc|backup)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			id, err := identityFlags(node, role)
			if err != nil {
				return err
			}
			ca, err := pki.LoadCA(dir)
			if err != nil {
				return fmt.Errorf("load the CA of %s (ursulactl cert init): %w", dir, err)
			}
			if name == "" {
				name = defaultCertName(id)
			}
			f, err := issue(ca, dir, name, id, hosts, days)
			if err != nil {
				return err
			}
			if a.o.json {
				return a.emit(issuedCert{Cert: f.CertFile, Key: f.KeyFile, Identity: id.String()})
			}
			fmt.Fprintf(a.env.Stdout, "issued %s for %s (key %s)\n", f.CertFile, id, f.KeyFile)
			return nil
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory of the CA and certificates")
	cmd.Flags().Uint64Var(&node, "node", 0, "issue for storage node id (raft.node_id)")
	cmd.Flags().StringVar(&role, "role", "", "issue for a role: gateway, coldgc or backup")
	cmd.Flags().StringVar(&name, "name", "", "file name without extension (default node<id> or the role)")
	cmd.Flags().StringSliceVar(&hosts, "host", nil, "host names or addresses to add (for clients that check them)")
	cmd.Flags().IntVar(&days, "days", 365, "validity in days")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

func certDevClusterCommand(a *app) *cobra.Command {
	var (
		dir   string
		nodes int
	)
	cmd := &cobra.Command{
		Use:   "dev-cluster",
		Short: "Create what a local development cluster needs: a CA, nodes 1..N, gateway, coldgc and backup (existing files are kept)",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			if nodes < 1 {
				return errors.New("--nodes must be at least 1")
			}
			ca, made, err := ensureCA(dir, "ursula-dev-cluster", 3650)
			if err != nil {
				return err
			}
			res := struct {
				CA        string       `json:"ca"`
				CACreated bool         `json:"ca_created"`
				Issued    []issuedCert `json:"issued"`
			}{CA: filepath.Join(dir, "ca.crt"), CACreated: made, Issued: []issuedCert{}}
			if made && !a.o.json {
				fmt.Fprintf(a.env.Stdout, "created the CA %s\n", res.CA)
			}
			ids := []pki.Identity{pki.RoleIdentity(pki.RoleGateway), pki.RoleIdentity(pki.RoleColdGC), pki.RoleIdentity(pki.RoleBackup)}
			for i := 1; i <= nodes; i++ {
				ids = append(ids, pki.NodeIdentity(uint64(i)))
			}
			for _, id := range ids {
				name := defaultCertName(id)
				if _, err := os.Stat(filepath.Join(dir, name+".crt")); err == nil {
					continue
				}
				f, err := issue(ca, dir, name, id, []string{"127.0.0.1", "localhost"}, 3650)
				if err != nil {
					return err
				}
				res.Issued = append(res.Issued, issuedCert{Cert: f.CertFile, Key: f.KeyFile, Identity: id.String()})
				if !a.o.json {
					fmt.Fprintf(a.env.Stdout, "issued %s for %s\n", f.CertFile, id)
				}
			}
			return a.done(res)
		},
	}
	cmd.Flags().StringVar(&dir, "dir", "", "directory of the CA and certificates")
	cmd.Flags().IntVar(&nodes, "nodes", 3, "number of storage nodes")
	_ = cmd.MarkFlagRequired("dir")
	return cmd
}

// issuedCert is one certificate a cert verb wrote (its --json result).
type issuedCert struct {
	Cert     string `json:"cert"`
	Key      string `json:"key"`
	Identity string `json:"identity"`
}

func identityFlags(node uint64, role string) (pki.Identity, error) {
	switch {
	case node != 0 && role != "":
		return pki.Identity{}, errors.New("give --node or --role, not both")
	case node != 0:
		return pki.NodeIdentity(node), nil
	case role != "":
		id, err := pki.ParseIdentity("urn:ursula:role:" + role)
		if err != nil {
			return pki.Identity{}, err
		}
		return id, nil
	}
	return pki.Identity{}, errors.New("give --node N or --role R")
}

func defaultCertName(id pki.Identity) string {
	if id.IsNode() {
		return fmt.Sprintf("node%d", id.Node)
	}
	return id.Role
}

// ensureCA loads the CA of dir, creating it (and dir, mode 700) when dir
// holds none; made reports a new one.
func ensureCA(dir, name string, days int) (*pki.CA, bool, error) {
	if ca, err := pki.LoadCA(dir); err == nil {
		return ca, false, nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, false, fmt.Errorf("load the CA of %s: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, err
	}
	ca, err := pki.NewCA(name, time.Duration(days)*24*time.Hour)
	if err != nil {
		return nil, false, err
	}
	if err := ca.Save(dir); err != nil {
		return nil, false, err
	}
	return ca, true, nil
}

func issue(ca *pki.CA, dir, name string, id pki.Identity, hosts []string, days int) (pki.Files, error) {
	is, err := ca.Issue(id, hosts, time.Duration(days)*24*time.Hour)
	if err != nil {
		return pki.Files{}, err
	}
	return is.Save(dir, name, filepath.Join(dir, "ca.crt"))
}
