package pki

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"
)

// DefaultCheckInterval is how often, at most, a Source looks at its files.
const DefaultCheckInterval = time.Second

// Files names a process's TLS material.
type Files struct {
	// CAFile is a PEM bundle of the CA certificates peers must chain to.
	CAFile string `toml:"ca_file"`
	// CertFile is this process's PEM certificate chain, leaf first.
	CertFile string `toml:"cert_file"`
	// KeyFile is the PEM private key of the leaf (mode 600).
	KeyFile string `toml:"key_file"`
}

// IsZero reports that no file is named (TLS off).
func (f Files) IsZero() bool { return f == Files{} }

// Validate checks that the set names a CA and, with needCert, a
// certificate and key; a key without its certificate (or the reverse) is
// always an error. prefix names the configuration section in errors.
func (f Files) Validate(prefix string, needCert bool) error {
	var errs []error
	if f.CAFile == "" {
		errs = append(errs, fmt.Errorf("%s.ca_file is required", prefix))
	}
	if (f.CertFile == "") != (f.KeyFile == "") {
		errs = append(errs, fmt.Errorf("%s: cert_file and key_file go together", prefix))
	} else if needCert && f.CertFile == "" {
		errs = append(errs, fmt.Errorf("%s: cert_file and key_file are required", prefix))
	}
	return errors.Join(errs...)
}

// material is one loaded set.
type material struct {
	cert  *tls.Certificate // nil: no certificate of our own (a client with a CA only)
	leaf  *x509.Certificate
	ident Identity
	roots *x509.CertPool
}

// stamp tells whether a file changed.
type stamp struct {
	size  int64
	mtime time.Time
	ino   uint64
}

// Source is a process's TLS material, reloaded from its files when they
// change. Its methods are safe for concurrent use.
type Source struct {
	files  Files
	logger *slog.Logger
	// CheckInterval is how often, at most, the files are looked at (on the
	// next handshake); zero looks at every handshake.
	CheckInterval time.Duration
	now           func() time.Time

	mu      sync.Mutex
	cur     *material
	stamps  []stamp
	checked time.Time
	failed  []stamp // the stamps of the last set that failed to load (logged once)
	reloads int
}

// Load reads files: the set must load now (the process refuses to start
// otherwise).
func Load(files Files, logger *slog.Logger) (*Source, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Source{files: files, logger: logger, CheckInterval: DefaultCheckInterval, now: time.Now}
	m, st, err := s.read()
	if err != nil {
		return nil, err
	}
	s.cur, s.stamps, s.checked = m, st, s.now()
	return s, nil
}

// Identity is the identity this process's certificate proves (zero
// without a certificate).
func (s *Source) Identity() Identity { return s.material().ident }

// NotAfter is when this process's certificate expires (zero without one).
func (s *Source) NotAfter() time.Time {
	if m := s.material(); m.leaf != nil {
		return m.leaf.NotAfter
	}
	return time.Time{}
}

// NotAfterOrZero is NotAfter, and zero for a nil source (TLS off).
func (s *Source) NotAfterOrZero() time.Time {
	if s == nil {
		return time.Time{}
	}
	return s.NotAfter()
}

// Reloads counts the sets loaded after the first.
func (s *Source) Reloads() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reloads
}

// Reload looks at the files now and loads them if they changed; it
// returns the error of a set that does not load (the previous one stays).
func (s *Source) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reloadLocked()
}

// material is the current set, after looking at the files if the check
// interval passed.
func (s *Source) material() *material {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now := s.now(); now.Sub(s.checked) >= s.CheckInterval {
		s.checked = now
		_ = s.reloadLocked()
	}
	return s.cur
}

func (s *Source) reloadLocked() error {
	st, err := s.stampFiles()
	if err != nil {
		return s.reloadFailed(st, err)
	}
	if slices.Equal(st, s.stamps) {
		return nil
	}
	m, st, err := s.read()
	if err != nil {
		return s.reloadFailed(st, err)
	}
	if s.cur.cert != nil && m.ident != s.cur.ident {
		return s.reloadFailed(st, fmt.Errorf("the new certificate proves %s, not %s", m.ident, s.cur.ident))
	}
	s.cur, s.stamps, s.failed = m, st, nil
	s.reloads++
	s.logger.Info("tls material reloaded", "cert_file", s.files.CertFile, "ca_file", s.files.CAFile, "identity", m.ident.String(), "not_after", notAfter(m))
	return nil
}

func notAfter(m *material) time.Time {
	if m.leaf == nil {
		return time.Time{}
	}
	return m.leaf.NotAfter
}

// reloadFailed logs a set that does not load, once per change of the
// files, and keeps the current one.
func (s *Source) reloadFailed(st []stamp, err error) error {
	if !slices.Equal(st, s.failed) {
		s.failed = st
		s.logger.Error("tls material changed but does not load: keeping the previous certificates", "cert_file", s.files.CertFile, "ca_file", s.files.CAFile, "err", err)
	}
	return err
}

func (s *Source) names() []string {
	out := []string{s.files.CAFile}
	if s.files.CertFile != "" {
		out = append(out, s.files.CertFile, s.files.KeyFile)
	}
	return out
}

func (s *Source) stampFiles() ([]stamp, error) {
	var out []stamp
	for _, name := range s.names() {
		fi, err := os.Stat(name)
		if err != nil {
			return out, err
		}
		st := stamp{size: fi.Size(), mtime: fi.ModTime()}
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
			st.ino = sys.Ino
		}
		out = append(out, st)
	}
	return out, nil
}

// read loads the files, stamping them before reading so that a change
// during the read is seen at the next check.
func (s *Source) read() (*material, []stamp, error) {
	st, err := s.stampFiles()
	if err != nil {
		return nil, st, fmt.Errorf("pki: %w", err)
	}
	m := &material{}
	caPEM, err := os.ReadFile(s.files.CAFile)
	if err != nil {
		return nil, st, fmt.Errorf("pki: read ca_file: %w", err)
	}
	m.roots = x509.NewCertPool()
	if !m.roots.AppendCertsFromPEM(caPEM) {
		return nil, st, fmt.Errorf("pki: ca_file %s holds no PEM certificate", s.files.CAFile)
	}
	if s.files.CertFile == "" {
		return m, st, nil
	}
	if err := checkKeyFileMode(s.files.KeyFile); err != nil {
		return nil, st, err
	}
	cert, err := tls.LoadX509KeyPair(s.files.CertFile, s.files.KeyFile)
	if err != nil {
		return nil, st, fmt.Errorf("pki: load %s and %s: %w", s.files.CertFile, s.files.KeyFile, err)
	}
	m.cert, m.leaf = &cert, cert.Leaf
	if m.ident, err = IdentityOf(m.leaf); err != nil {
		return nil, st, fmt.Errorf("pki: cert_file %s: %w", s.files.CertFile, err)
	}
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	if _, err := m.leaf.Verify(x509.VerifyOptions{Roots: m.roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, st, fmt.Errorf("pki: cert_file %s does not chain to ca_file %s: %w", s.files.CertFile, s.files.CAFile, err)
	}
	return m, st, nil
}

// checkKeyFileMode refuses a key others may read: group and others must
// not read it, except that a file root manages for a process that is not
// root may be readable by its group (a Kubernetes Secret mounted for the
// pod's fsGroup, mode 0440).
func checkKeyFileMode(name string) error {
	fi, err := os.Stat(name)
	if err != nil {
		return fmt.Errorf("pki: %w", err)
	}
	if rootManaged(fi) && fi.Mode().Perm()&0o037 == 0 {
		return nil
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return fmt.Errorf("pki: key_file %s has mode %04o: group and others must not read it (chmod 600)", name, fi.Mode().Perm())
	}
	return nil
}
