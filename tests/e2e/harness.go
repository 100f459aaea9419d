package e2e

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ursula/ursula/internal/freeport"
	"github.com/ursula/ursula/tests/await"
)

// Environment variables that point the harness at prebuilt binaries.
const (
	// EnvBin names the all-in-one ursula binary.
	EnvBin = "URSULA_BIN"
	// EnvBinDir names a directory holding every binary (bin/ after make build).
	EnvBinDir = "URSULA_BIN_DIR"
)

// DefaultListenFlags are the listeners of the all-in-one binary. The harness
// gives each one the binary defines a free loopback port, so that tests never
// touch the defaults (4437, 4438, 4439, 4447) a developer's `make run` may be
// using.
var DefaultListenFlags = []string{"gateway.listen", "server.listen", "server.admin_listen", "server.cluster_listen"}

var probed struct {
	mu    sync.Mutex
	flags map[string]bool // "bin\x00flag" -> defined
}

// DefinesFlag reports whether the binary accepts -name: it runs
// `bin -name=127.0.0.1:0 -verify-config` and looks for the flag package's
// "flag provided but not defined". Answers are cached per process.
func DefinesFlag(bin, name string) (bool, error) {
	probed.mu.Lock()
	defer probed.mu.Unlock()
	key := bin + "\x00" + name
	if v, ok := probed.flags[key]; ok {
		return v, nil
	}
	dir, err := os.MkdirTemp("", "ursula-probe-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.Command(bin, "-"+name+"=127.0.0.1:0", "-verify-config")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil && !bytes.Contains(out, []byte("flag provided but not defined")) {
		var exit *exec.ExitError
		if !errors.As(err, &exit) {
			return false, fmt.Errorf("probe %s -%s: %w", bin, name, err)
		}
	}
	v := !bytes.Contains(out, []byte("flag provided but not defined: -"+name))
	if probed.flags == nil {
		probed.flags = map[string]bool{}
	}
	probed.flags[key] = v
	return v, nil
}

var built struct {
	mu    sync.Mutex
	dir   string
	paths map[string]string
}

// Binary returns the path of the named binary (ursula, ursula-node,
// ursula-gateway): $URSULA_BIN for ursula, else $URSULA_BIN_DIR/name, else a
// fresh go build of ./services/cmd/<name>, done once per process.
func Binary(name string) (string, error) {
	if name == "ursula" {
		if p := os.Getenv(EnvBin); p != "" {
			return existing(p, EnvBin)
		}
	}
	if d := os.Getenv(EnvBinDir); d != "" {
		return existing(filepath.Join(d, name), EnvBinDir)
	}
	return build(name, "")
}

// TaggedBinary builds the named binary with build tags (go build -tags
// tags ./services/cmd/<name>), once per process, and returns its path: a
// second build of the node that a test mixes with the current one (the
// feature-level upgrade test's featuretest build). The environment's
// prebuilt binaries never stand for it.
func TaggedBinary(name, tags string) (string, error) { return build(name, tags) }

// build runs go build of ./services/cmd/<name> (with tags, if any) once
// per process and returns the binary's path.
func build(name, tags string) (string, error) {
	built.mu.Lock()
	defer built.mu.Unlock()
	key := name + " -tags " + tags
	if p, ok := built.paths[key]; ok {
		return p, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	if built.dir == "" {
		if built.dir, err = os.MkdirTemp("", "ursula-e2e-bin-"); err != nil {
			return "", err
		}
		built.paths = map[string]string{}
	}
	dir := built.dir
	if tags != "" {
		dir = filepath.Join(built.dir, "tags-"+strings.ReplaceAll(tags, ",", "-"))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
	}
	out := filepath.Join(dir, name)
	cmd := exec.Command("go", "build", "-tags", tags, "-o", out, "./services/cmd/"+name)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build -tags %q ./services/cmd/%s (without tags, set %s or %s to use a prebuilt binary): %v\n%s",
			tags, name, EnvBin, EnvBinDir, err, b)
	}
	built.paths[key] = out
	return out, nil
}

func existing(p, from string) (string, error) {
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(abs); err != nil {
		return "", fmt.Errorf("binary from $%s: %w", from, err)
	}
	return abs, nil
}

// ModuleRoot returns the directory of the repository's go.mod.
func ModuleRoot() (string, error) {
	out, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return "", errors.New("not inside the ursula module (go env GOMOD is empty)")
	}
	return filepath.Dir(gomod), nil
}

// RemoveBuilt deletes the binaries Binary built.
func RemoveBuilt() {
	built.mu.Lock()
	defer built.mu.Unlock()
	if built.dir != "" {
		os.RemoveAll(built.dir)
		built.dir, built.paths = "", nil
	}
}

// Main runs a test package that uses the harness and then removes the
// binaries it built: `func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }`.
func Main(m *testing.M) int {
	code := m.Run()
	RemoveBuilt()
	return code
}

// DefinedFlags returns those of names that the binary defines.
func DefinedFlags(bin string, names ...string) ([]string, error) {
	var out []string
	for _, f := range names {
		ok, err := DefinesFlag(bin, f)
		if err != nil {
			return nil, err
		}
		if ok {
			out = append(out, f)
		}
	}
	return out, nil
}

// Options describes a server process.
type Options struct {
	// Binary is the executable; empty means Binary("ursula").
	Binary string
	// WorkDir is the process's working directory; empty means a fresh
	// temporary directory, removed by Close.
	WorkDir string
	// DataDir is passed as -raft.wal.path when set. Empty leaves the binary's
	// default (./data, inside WorkDir).
	DataDir string
	// ListenFlags get a free loopback address each, passed as -flag=addr.
	// Nil means those of DefaultListenFlags that the binary defines.
	ListenFlags []string
	// Addrs are listeners whose addresses the caller fixed elsewhere, for
	// example in a config file: they are not passed as flags, but Addrs,
	// URL and ReadyFlag know them. Keys are named like listen flags.
	Addrs map[string]string
	// ReadyFlag names the listener serving /__ursula/ready (a listen flag
	// or a key of Addrs); empty means gateway.listen.
	ReadyFlag string
	// Args are extra flags, appended after the listen flags.
	Args []string
	// Env is added to the test's environment.
	Env []string
	// ReadyTimeout bounds WaitReady; zero means 60 s.
	ReadyTimeout time.Duration
	// TLS is the client configuration of the process's HTTP listeners
	// when they serve TLS (a node with server.client_tls); nil: plain HTTP.
	TLS *tls.Config
}

// Server is one spawned server process. Its addresses and data directory stay
// the same across restarts. Signals go to its pid only.
type Server struct {
	Bin     string
	WorkDir string
	// Addrs maps each listen flag (without the dash) to its address.
	Addrs   map[string]string
	LogPath string

	opts    Options
	ownsDir bool

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	exitErr error
	starts  int
}

// NewServer prepares a server: it locates the binary, creates the working
// directory and picks free ports. It starts nothing.
func NewServer(opts Options) (*Server, error) {
	s := &Server{opts: opts, Bin: opts.Binary, WorkDir: opts.WorkDir}
	if s.opts.ReadyFlag == "" {
		s.opts.ReadyFlag = "gateway.listen"
	}
	if s.opts.ReadyTimeout == 0 {
		s.opts.ReadyTimeout = 60 * time.Second
	}
	if s.Bin == "" {
		bin, err := Binary("ursula")
		if err != nil {
			return nil, err
		}
		s.Bin = bin
	}
	// The process runs in WorkDir, so a relative path would not resolve.
	bin, err := exec.LookPath(s.Bin)
	if err != nil {
		return nil, err
	}
	if s.Bin, err = filepath.Abs(bin); err != nil {
		return nil, err
	}
	if s.opts.ListenFlags == nil {
		flags, err := DefinedFlags(s.Bin, DefaultListenFlags...)
		if err != nil {
			return nil, err
		}
		s.opts.ListenFlags = flags
	}
	if s.WorkDir == "" {
		dir, err := os.MkdirTemp("", "ursula-e2e-")
		if err != nil {
			return nil, err
		}
		s.WorkDir, s.ownsDir = dir, true
	} else if err := os.MkdirAll(s.WorkDir, 0o755); err != nil {
		return nil, err
	}
	addrs, err := freeport.Addrs(len(s.opts.ListenFlags))
	if err != nil {
		return nil, err
	}
	s.Addrs = make(map[string]string, len(addrs)+len(s.opts.Addrs))
	for k, a := range s.opts.Addrs {
		s.Addrs[k] = a
	}
	for i, f := range s.opts.ListenFlags {
		s.Addrs[f] = addrs[i]
	}
	if _, ok := s.Addrs[s.opts.ReadyFlag]; !ok {
		return nil, fmt.Errorf("ready flag %q is not among the listen flags %v or the fixed addresses", s.opts.ReadyFlag, s.opts.ListenFlags)
	}
	s.LogPath = filepath.Join(s.WorkDir, filepath.Base(s.Bin)+".log")
	return s, nil
}

// StartServer starts a server and waits until it is ready, failing tb
// otherwise. At cleanup the process is killed if it still runs, and its log
// is printed if the test failed.
func StartServer(tb testing.TB, opts Options) *Server {
	tb.Helper()
	if opts.WorkDir == "" {
		opts.WorkDir = tb.TempDir()
	}
	s, err := NewServer(opts)
	if err != nil {
		tb.Fatalf("prepare server: %v", err)
	}
	tb.Cleanup(func() {
		s.Close()
		if tb.Failed() {
			tb.Logf("last lines of %s:\n%s", s.LogPath, s.LogTail(200))
		}
	})
	if err := s.Start(); err != nil {
		tb.Fatalf("start server: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.opts.ReadyTimeout)
	defer cancel()
	if err := s.WaitReady(ctx); err != nil {
		tb.Fatalf("server not ready: %v", err)
	}
	return s
}

// Args are the command-line flags the server is started with.
func (s *Server) Args() []string {
	args := make([]string, 0, len(s.opts.ListenFlags)+len(s.opts.Args)+1)
	for _, f := range s.opts.ListenFlags {
		args = append(args, "-"+f+"="+s.Addrs[f])
	}
	if s.opts.DataDir != "" {
		args = append(args, "-raft.wal.path="+s.opts.DataDir)
	}
	return append(args, s.opts.Args...)
}

// URL is the base URL of the ready listener (the gateway), without a
// trailing slash.
func (s *Server) URL() string { return s.scheme() + s.Addrs[s.opts.ReadyFlag] }

func (s *Server) scheme() string {
	if s.opts.TLS != nil {
		return "https://"
	}
	return "http://"
}

// SplitTokens makes the bearer token an ursula-gateway in front of an
// ursula-node proves its role with: the node's flags (its token file,
// "gateway <token>") and the gateway's (its token file).
func SplitTokens(tb testing.TB) (nodeArgs, gatewayArgs []string) {
	tb.Helper()
	dir := tb.TempDir()
	var raw [32]byte
	if _, err := crand.Read(raw[:]); err != nil {
		tb.Fatal(err)
	}
	tok := hex.EncodeToString(raw[:])
	nodeFile, gwFile := filepath.Join(dir, "node.tokens"), filepath.Join(dir, "gateway.token")
	if err := os.WriteFile(nodeFile, []byte("gateway "+tok+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := os.WriteFile(gwFile, []byte(tok+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	return []string{"-server.client_token_file=" + nodeFile}, []string{"-upstream.token_file=" + gwFile}
}

// AdminTokenFile is the admin token file the process created in its data
// directory on first start (-raft.wal.path, or ./data in its working
// directory).
func (s *Server) AdminTokenFile() string {
	dir := s.opts.DataDir
	if dir == "" {
		dir = filepath.Join(s.WorkDir, "data")
	}
	return filepath.Join(dir, "admin.token")
}

// AdminAuth is the Authorization header value of admin mutations.
func (s *Server) AdminAuth(tb testing.TB) string {
	tb.Helper()
	b, err := os.ReadFile(s.AdminTokenFile())
	if err != nil {
		tb.Fatalf("read the admin token: %v", err)
	}
	return "Bearer " + strings.TrimSpace(string(b))
}

// HTTPClient is a client of the process's HTTP listeners (TLS when they
// serve it), with timeout.
func (s *Server) HTTPClient(timeout time.Duration) *http.Client {
	c := &http.Client{Timeout: timeout}
	if s.opts.TLS != nil {
		c.Transport = &http.Transport{TLSClientConfig: s.opts.TLS.Clone()}
	}
	return c
}

// Start spawns the process. Output of every start goes to LogPath.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil && !isClosed(s.exited) {
		return fmt.Errorf("%s already running as pid %d", s.Bin, s.cmd.Process.Pid)
	}
	logf, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close() // the child holds its own descriptor
	s.starts++
	args := s.Args()
	fmt.Fprintf(logf, "=== harness: start #%d at %s: %s %s\n", s.starts,
		time.Now().Format(time.RFC3339Nano), s.Bin, strings.Join(args, " "))
	cmd := exec.Command(s.Bin, args...)
	cmd.Dir = s.WorkDir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), s.opts.Env...)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.Bin, err)
	}
	exited := make(chan struct{})
	s.cmd, s.exited, s.exitErr = cmd, exited, nil
	go func() {
		err := cmd.Wait()
		s.mu.Lock()
		s.exitErr = err
		s.mu.Unlock()
		close(exited)
	}()
	return nil
}

// Restart starts the stopped process again with the same flags, ports and
// data directory, and waits until it is ready.
func (s *Server) Restart(ctx context.Context) error {
	if err := s.Start(); err != nil {
		return err
	}
	return s.WaitReady(ctx)
}

// WaitReady polls GET /__ursula/ready until it answers 200. It gives up when
// the process exits or ctx ends (or after ReadyTimeout when ctx has no
// deadline).
func (s *Server) WaitReady(ctx context.Context) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.opts.ReadyTimeout)
		defer cancel()
	}
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	if exited == nil {
		return errors.New("server was never started")
	}
	client := s.HTTPClient(time.Second)
	url := s.URL() + "/__ursula/ready"
	start := time.Now()
	last := "no answer yet"
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s.checkSettingNames()
			}
			last = resp.Status
		} else {
			last = err.Error()
		}
		select {
		case <-exited:
			return fmt.Errorf("%s exited before it was ready (%v); log tail:\n%s", s.Bin, s.ExitErr(), s.LogTail(60))
		case <-ctx.Done():
			return fmt.Errorf("GET %s not 200 after %v (last: %s); log tail:\n%s",
				url, time.Since(start).Round(time.Millisecond), last, s.LogTail(60))
		case <-tick.C:
		}
	}
}

// DeprecatedWarning is what a binary logs for each deprecated setting name
// it was given.
const DeprecatedWarning = "deprecated setting name"

// checkSettingNames fails a server started with deprecated setting names:
// the tests must run the binaries as an operator following the docs
// would, with the current names (config_test checks the aliases).
func (s *Server) checkSettingNames() error {
	log, err := os.ReadFile(s.LogPath)
	if err != nil {
		return err
	}
	if i := bytes.Index(log, []byte(DeprecatedWarning)); i >= 0 {
		line, _, _ := bytes.Cut(log[i:], []byte("\n"))
		return fmt.Errorf("%s was started with a deprecated setting name: %s", s.Bin, line)
	}
	return nil
}

// PID is the current (or last) process id, 0 before the first start.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Running reports whether the process has been started and not yet exited.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil && !isClosed(s.exited)
}

// ExitErr is the error cmd.Wait returned for the last process (nil while it
// runs or after a clean exit).
func (s *Server) ExitErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exitErr
}

// Kill sends SIGKILL and waits for the process to go.
func (s *Server) Kill() error {
	if err := s.signal(syscall.SIGKILL); err != nil {
		return err
	}
	return s.wait(await.DefaultTimeout)
}

// Terminate sends SIGTERM and waits up to timeout for a clean exit. A process
// still running then is killed; that, and a non-zero exit, are errors.
func (s *Server) Terminate(timeout time.Duration) error {
	if err := s.signal(syscall.SIGTERM); err != nil {
		return err
	}
	if err := s.wait(timeout); err != nil {
		s.Kill()
		return fmt.Errorf("after SIGTERM: %w", err)
	}
	if err := s.ExitErr(); err != nil {
		return fmt.Errorf("after SIGTERM the process exited with %v", err)
	}
	return nil
}

// Close kills the process if it runs and removes the working directory if
// the harness created it.
func (s *Server) Close() {
	if s.Running() {
		s.Kill()
	}
	if s.ownsDir {
		os.RemoveAll(s.WorkDir)
	}
}

func (s *Server) signal(sig syscall.Signal) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || isClosed(s.exited) {
		return fmt.Errorf("%s is not running", s.Bin)
	}
	return s.cmd.Process.Signal(sig)
}

func (s *Server) wait(timeout time.Duration) error {
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	select {
	case <-exited:
		return nil
	case <-time.After(timeout):
		return fmt.Errorf("pid %d still running after %v", s.PID(), timeout)
	}
}

// LogTail returns the last n lines of the process log.
func (s *Server) LogTail(n int) string {
	return s.lastLogLines(n, func(l []byte) []byte { return l })
}

// LogWarnings returns the last n warnings and errors of the process's log,
// each cut to a few hundred bytes.
func (s *Server) LogWarnings(n int) string {
	return s.lastLogLines(n, func(l []byte) []byte {
		if !bytes.Contains(l, []byte("level=WARN")) && !bytes.Contains(l, []byte("level=ERROR")) {
			return nil
		}
		return l[:min(len(l), 300)]
	})
}

// lastLogLines returns the last n lines of the process log that keep maps
// to something (nil drops a line), joined.
func (s *Server) lastLogLines(n int, keep func([]byte) []byte) string {
	b, err := os.ReadFile(s.LogPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	var out [][]byte
	for _, l := range bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n")) {
		if k := keep(l); k != nil {
			out = append(out, k)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return string(bytes.Join(out, []byte("\n")))
}

func isClosed(c chan struct{}) bool {
	if c == nil {
		return true
	}
	select {
	case <-c:
		return true
	default:
		return false
	}
}
