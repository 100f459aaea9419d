package objstoretest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/ursula/ursula/internal/freeport"
	"github.com/ursula/ursula/storage/objstore"
)

const (
	module = "github.com/ursula/ursula"
	// envBinary names the versitygw binary; the Makefile's test targets
	// export it.
	envBinary = "VERSITYGW"
	region    = "us-east-1"
	// startTimeout bounds how long Start waits for the port to accept.
	startTimeout = 15 * time.Second
	// outputLimit is how much of the server's output is kept for errors.
	outputLimit = 16 << 10
)

// S3Server is a versitygw process (posix backend) serving a temporary
// directory on 127.0.0.1. Stop kills it, Start brings it back on the same
// port and data, so a test can cut the object store off and restore it.
type S3Server struct {
	// Endpoint is the server's URL, http://127.0.0.1:<port>.
	Endpoint string
	// AccessKey and SecretKey are the root credentials it accepts.
	AccessKey string
	SecretKey string
	// Dir is the data directory: one subdirectory per bucket, an object
	// per file.
	Dir string

	bin  string
	addr string

	output *tailBuffer

	mu     sync.Mutex
	proc   *process // the latest process, nil before the first Start
	closed bool
}

// process is one run of versitygw.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
	err    error         // cmd.Wait's result; read it after exited is closed
}

// NewS3Server starts a server for the test and closes it (killing the
// process, removing its data) when the test ends. Without a versitygw
// binary the test fails; it is never skipped.
func NewS3Server(t testing.TB) *S3Server {
	t.Helper()
	s, err := StartS3Server()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("objstoretest: close S3 server: %v", err)
		}
	})
	return s
}

// StartS3Server starts a server outside a test (in TestMain, say); the
// caller must Close it.
func StartS3Server() (*S3Server, error) {
	bin, err := FindVersitygw()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "objstoretest-versitygw-")
	if err != nil {
		return nil, fmt.Errorf("objstoretest: %w", err)
	}
	s := &S3Server{
		AccessKey: "objstoretest",
		SecretKey: "objstoretest-secret",
		Dir:       dir,
		bin:       bin,
		output:    &tailBuffer{limit: outputLimit},
	}
	// A free port can be taken between picking and binding it; only then
	// is another port tried.
	for attempt := 0; ; attempt++ {
		s.addr, err = freeAddr()
		if err == nil {
			s.Endpoint = "http://" + s.addr
			err = s.Start()
		}
		if err == nil {
			return s, nil
		}
		if attempt == 2 || !strings.Contains(s.output.String(), "address already in use") {
			os.RemoveAll(dir)
			return nil, err
		}
	}
}

// Start starts the server if it is not running, on the same port and data
// directory as before, and returns once the port accepts connections.
func (s *S3Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("objstoretest: start: server closed")
	}
	if s.running() {
		return nil
	}
	cmd := exec.Command(s.bin, "--port", s.addr, "--quiet", "posix", s.Dir)
	cmd.Env = append(serverEnv(),
		"ROOT_ACCESS_KEY="+s.AccessKey,
		"ROOT_SECRET_KEY="+s.SecretKey,
	)
	cmd.Stdout = s.output
	cmd.Stderr = s.output
	setProcAttr(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("objstoretest: start %s: %w", s.bin, err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	s.proc = p
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()

	deadline := time.Now().Add(startTimeout)
	for {
		conn, err := net.DialTimeout("tcp", s.addr, 100*time.Millisecond)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-p.exited:
			return fmt.Errorf("objstoretest: versitygw on %s exited at start (%v); output:\n%s",
				s.addr, p.err, s.output.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stopLocked()
			return fmt.Errorf("objstoretest: versitygw did not accept on %s within %v; output:\n%s",
				s.addr, startTimeout, s.output.String())
		}
	}
}

// Stop kills the server (SIGKILL, as a crash or an outage would) and
// waits for it to exit. Stopping a stopped server does nothing.
func (s *S3Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

func (s *S3Server) stopLocked() {
	if !s.running() {
		return
	}
	_ = s.proc.cmd.Process.Kill()
	<-s.proc.exited
}

// running reports whether the latest process is alive; s.mu is held.
func (s *S3Server) running() bool {
	if s.proc == nil {
		return false
	}
	select {
	case <-s.proc.exited:
		return false
	default:
		return true
	}
}

// Close stops the server and removes its data directory. It is
// idempotent.
func (s *S3Server) Close() error {
	s.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	if err := os.RemoveAll(s.Dir); err != nil {
		return fmt.Errorf("objstoretest: remove data: %w", err)
	}
	return nil
}

// S3Config returns the configuration of a store in bucket under prefix on
// this server (path style, static credentials); the bucket must exist (see
// CreateBucket).
func (s *S3Server) S3Config(bucket, prefix string) objstore.S3Config {
	return objstore.S3Config{
		Bucket:    bucket,
		Prefix:    prefix,
		Endpoint:  s.Endpoint,
		Region:    region,
		PathStyle: true,
		AccessKey: s.AccessKey,
		SecretKey: s.SecretKey,
	}
}

// Client returns an SDK client for the server, for what Store does not do.
func (s *S3Server) Client() *s3.Client {
	return s3.New(s3.Options{
		Region:                     region,
		BaseEndpoint:               aws.String(s.Endpoint),
		UsePathStyle:               true,
		Credentials:                credentials.NewStaticCredentialsProvider(s.AccessKey, s.SecretKey, ""),
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
}

// CreateBucket creates a bucket (a valid S3 name: 3–63 lower-case letters,
// digits, '-' and '.'); one that exists already is fine.
func (s *S3Server) CreateBucket(t testing.TB, name string) {
	t.Helper()
	if err := s.createBucket(t.Context(), name); err != nil {
		t.Fatal(err)
	}
}

func (s *S3Server) createBucket(ctx context.Context, name string) error {
	_, err := s.Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(name)})
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode() == "BucketAlreadyOwnedByYou" {
		return nil
	}
	if err != nil {
		return fmt.Errorf("objstoretest: create bucket %q: %w", name, err)
	}
	return nil
}

// FindVersitygw returns the versitygw binary: $VERSITYGW, else bin/versitygw
// at the root of the ursula module (found by walking up from the working
// directory), else versitygw on PATH.
func FindVersitygw() (string, error) {
	const hint = "build it with `make bin/versitygw` at the repository root, or set VERSITYGW to a versitygw binary"
	if bin := os.Getenv(envBinary); bin != "" {
		if err := executable(bin); err != nil {
			return "", fmt.Errorf("objstoretest: %s=%s: %v; %s", envBinary, bin, err, hint)
		}
		return bin, nil
	}
	var looked []string
	if root, err := moduleRoot(); err == nil {
		bin := filepath.Join(root, "bin", "versitygw")
		if executable(bin) == nil {
			return bin, nil
		}
		looked = append(looked, bin)
	}
	if bin, err := exec.LookPath("versitygw"); err == nil {
		return bin, nil
	}
	looked = append(looked, "versitygw on PATH")
	return "", fmt.Errorf("objstoretest: no versitygw binary (looked for $%s, %s); %s",
		envBinary, strings.Join(looked, ", "), hint)
}

func executable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return errors.New("not an executable file")
	}
	return nil
}

// moduleRoot walks up from the working directory to the directory whose
// go.mod declares the ursula module.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if modulePath(filepath.Join(dir, "go.mod")) == module {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of %s above the working directory", module)
		}
		dir = parent
	}
}

// modulePath returns the module path a go.mod declares, or "".
func modulePath(gomod string) string {
	data, err := os.ReadFile(gomod)
	if err != nil {
		return ""
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 && fields[0] == "module" {
			if p, err := strconv.Unquote(fields[1]); err == nil {
				return p
			}
			return fields[1]
		}
	}
	return ""
}

// freeAddr returns 127.0.0.1:<a port that was free a moment ago>
// (internal/freeport says why below the ephemeral range).
func freeAddr() (string, error) {
	addr, err := freeport.Addr()
	if err != nil {
		return "", fmt.Errorf("objstoretest: pick a port: %w", err)
	}
	return addr, nil
}

// serverEnv is this process's environment without the variables that
// configure versitygw, so the server runs the same everywhere.
func serverEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "VGW_") || strings.HasPrefix(kv, "ROOT_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// tailBuffer keeps the last limit bytes written to it.
type tailBuffer struct {
	limit int
	mu    sync.Mutex
	buf   []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.limit; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}
