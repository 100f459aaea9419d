package objstore_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/ursula/ursula/storage/objstore"
	"github.com/ursula/ursula/storage/objstore/objstoretest"
)

// The package's S3 server, started by the first test that needs it and
// stopped by TestMain.
var (
	s3Once   sync.Once
	s3Server *objstoretest.S3Server
	s3Err    error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if s3Server != nil {
		if err := s3Server.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

func sharedS3(t *testing.T) *objstoretest.S3Server {
	t.Helper()
	s3Once.Do(func() { s3Server, s3Err = objstoretest.StartS3Server() })
	if s3Err != nil {
		t.Fatal(s3Err)
	}
	return s3Server
}

// smallParts makes multipart uploads start at 5 MiB, in 5 MiB parts, so the
// contract's 12 MiB object goes up in three parts.
func smallParts(cfg objstore.S3Config) objstore.S3Config {
	cfg.MultipartThreshold = objstoretest.PartBoundary
	cfg.PartSize = objstoretest.PartBoundary
	return cfg
}

var storeSeq atomic.Int64

func newS3Store(t *testing.T, cfg objstore.S3Config) *objstore.S3 {
	t.Helper()
	s, err := objstore.NewS3(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestMemory(t *testing.T) {
	objstoretest.Contract(t, func(*testing.T) objstore.Store { return objstore.NewMemory() })
}

func TestFS(t *testing.T) {
	objstoretest.Contract(t, func(t *testing.T) objstore.Store {
		s, err := objstore.NewFS(filepath.Join(t.TempDir(), "store"))
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestS3(t *testing.T) {
	srv := sharedS3(t)
	srv.CreateBucket(t, "contract")
	t.Run("prefix", func(t *testing.T) {
		objstoretest.Contract(t, func(t *testing.T) objstore.Store {
			prefix := fmt.Sprintf("root/store-%d", storeSeq.Add(1))
			return newS3Store(t, smallParts(srv.S3Config("contract", prefix)))
		})
	})
	t.Run("bucket root", func(t *testing.T) {
		objstoretest.Contract(t, func(t *testing.T) objstore.Store {
			bucket := fmt.Sprintf("contract-root-%d", storeSeq.Add(1))
			srv.CreateBucket(t, bucket)
			return newS3Store(t, smallParts(srv.S3Config(bucket, "")))
		})
	})
}

// TestS3Multipart checks that a body above the threshold really went up in
// parts: a multipart object's ETag ends in -<parts>.
func TestS3Multipart(t *testing.T) {
	srv := sharedS3(t)
	srv.CreateBucket(t, "multipart")
	s := newS3Store(t, smallParts(srv.S3Config("multipart", "p")))
	ctx := t.Context()
	if err := s.Put(ctx, "big", make([]byte, objstoretest.LargeObjectSize)); err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "small", make([]byte, objstoretest.PartBoundary)); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{"p/big": true, "p/small": false} {
		out, err := srv.Client().HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String("multipart"), Key: aws.String(key)})
		if err != nil {
			t.Fatal(err)
		}
		etag := strings.Trim(aws.ToString(out.ETag), `"`)
		if got := strings.HasSuffix(etag, "-3"); got != want {
			t.Errorf("%s: ETag %s; multipart in 3 parts = %v, want %v", key, etag, got, want)
		}
	}
	// No upload was left behind.
	ups, err := srv.Client().ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: aws.String("multipart")})
	if err != nil {
		t.Fatal(err)
	}
	if len(ups.Uploads) != 0 {
		t.Errorf("%d multipart uploads left open", len(ups.Uploads))
	}
}

// TestS3Delete deletes more keys than one DeleteObjects request carries.
func TestS3Delete(t *testing.T) {
	srv := sharedS3(t)
	srv.CreateBucket(t, "delete")
	s := newS3Store(t, srv.S3Config("delete", ""))
	ctx := t.Context()
	var keys []string
	for i := range 1005 {
		keys = append(keys, fmt.Sprintf("k/%04d", i))
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, key := range keys[1000:] {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := s.Put(ctx, key, []byte(key)); err != nil {
				t.Error(err)
			}
		})
	}
	// Plus one inside the first batch.
	if err := s.Put(ctx, keys[3], nil); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := s.Delete(ctx, keys...); err != nil {
		t.Fatal(err)
	}
	n := 0
	if err := s.List(ctx, "", func(objstore.Info) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d objects left after Delete", n)
	}
}

// TestS3Outage stops the server: operations then fail with errors that are
// not ErrNotFound; after a restart the same objects are there again.
func TestS3Outage(t *testing.T) {
	srv := objstoretest.NewS3Server(t) // its own: stopping it must not disturb other tests
	srv.CreateBucket(t, "outage")
	s := newS3Store(t, srv.S3Config("outage", "p"))
	ctx := t.Context()
	if err := s.Put(ctx, "kept", []byte("survives")); err != nil {
		t.Fatal(err)
	}

	srv.Stop()
	down, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	checkDown := func(op string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s with the server down: no error", op)
			return
		}
		if errors.Is(err, objstore.ErrNotFound) || errors.Is(err, objstore.ErrInvalidRange) {
			t.Errorf("%s with the server down: %v looks like an answer about the object", op, err)
		}
		t.Logf("%s with the server down: %v", op, err)
	}
	_, err := s.Get(down, "kept")
	checkDown("get", err)
	_, err = s.Head(down, "kept")
	checkDown("head", err)
	_, err = s.GetRange(down, "kept", 0, 1)
	checkDown("get-range", err)
	_, err = s.PutIfAbsent(down, "new", []byte("x"))
	checkDown("put-if-absent", err)
	checkDown("list", s.List(down, "", func(objstore.Info) error { return nil }))

	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, "kept")
	if err != nil || string(got) != "survives" {
		t.Fatalf("Get after restart = %q, %v", got, err)
	}
	if _, err := s.Head(ctx, "new"); !errors.Is(err, objstore.ErrNotFound) {
		t.Fatalf("Head of the object whose write failed during the outage: %v, want ErrNotFound", err)
	}
}

// TestS3MissingBucket: a missing bucket is a broken configuration, not a
// missing object.
func TestS3MissingBucket(t *testing.T) {
	srv := sharedS3(t)
	s := newS3Store(t, srv.S3Config("no-such-bucket", ""))
	_, err := s.Get(t.Context(), "k")
	if err == nil || errors.Is(err, objstore.ErrNotFound) {
		t.Fatalf("Get in a missing bucket: %v, want an error that is not ErrNotFound", err)
	}
}

// TestS3ForeignKeys: objects under the root written by others with keys a
// Store would reject are not listed.
func TestS3ForeignKeys(t *testing.T) {
	srv := sharedS3(t)
	srv.CreateBucket(t, "foreign")
	ctx := t.Context()
	for _, key := range []string{"p/ok", `p/back\slash`, "p/.objstore-tmp-1", "p/dir/", "other"} {
		_, err := srv.Client().PutObject(ctx, &s3.PutObjectInput{
			Bucket: aws.String("foreign"), Key: aws.String(key), Body: strings.NewReader(""),
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	s := newS3Store(t, srv.S3Config("foreign", "/p/"))
	var got []string
	if err := s.List(ctx, "", func(info objstore.Info) error { got = append(got, info.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != "ok" {
		t.Fatalf("List = %q, want [ok]", got)
	}
}

func TestFSLayout(t *testing.T) {
	dir := t.TempDir()
	s, err := objstore.NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := s.Put(ctx, "a/b/c", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if body, err := os.ReadFile(filepath.Join(dir, "a", "b", "c")); err != nil || string(body) != "x" {
		t.Fatalf("the object's file: %q, %v", body, err)
	}

	t.Run("temp files are not objects", func(t *testing.T) {
		tmp := filepath.Join(dir, "a", ".objstore-tmp-leftover")
		if err := os.WriteFile(tmp, []byte("partial"), 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(tmp)
		var keys []string
		if err := s.List(ctx, "", func(info objstore.Info) error { keys = append(keys, info.Key); return nil }); err != nil {
			t.Fatal(err)
		}
		if len(keys) != 1 || keys[0] != "a/b/c" {
			t.Fatalf("List = %q, want [a/b/c]", keys)
		}
	})

	t.Run("no temp files left", func(t *testing.T) {
		if _, err := s.PutIfAbsent(ctx, "a/b/c", []byte("y")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.PutIfAbsent(ctx, "a/b/d", []byte("y")); err != nil {
			t.Fatal(err)
		}
		if err := s.Put(ctx, "a/b/d", []byte("z")); err != nil {
			t.Fatal(err)
		}
		entries, err := os.ReadDir(filepath.Join(dir, "a", "b"))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".objstore-tmp") {
				t.Errorf("temp file %s left behind", e.Name())
			}
		}
		if err := s.Delete(ctx, "a/b/d"); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("delete removes empty directories", func(t *testing.T) {
		if err := s.Put(ctx, "a/keep", nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, "a/b/c"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir, "a", "b")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a/b after deleting its last object: %v, want it removed", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "a")); err != nil {
			t.Fatalf("a, which still holds a/keep: %v", err)
		}
		if err := s.Delete(ctx, "a/keep"); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(dir, "a")); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("a after deleting its last object: %v, want it removed", err)
		}
		if _, err := os.Stat(dir); err != nil {
			t.Fatalf("the root: %v, want it kept", err)
		}
	})

	t.Run("object and directory conflict", func(t *testing.T) {
		if err := s.Put(ctx, "x", nil); err != nil {
			t.Fatal(err)
		}
		err := s.Put(ctx, "x/y", nil)
		if err == nil || errors.Is(err, objstore.ErrNotFound) || !strings.Contains(err.Error(), `"x"`) {
			t.Fatalf("Put(x/y) with x an object: %v, want an error naming x", err)
		}
		if err := s.Put(ctx, "d/e", nil); err != nil {
			t.Fatal(err)
		}
		if err := s.Put(ctx, "d", nil); err == nil {
			t.Fatal("Put(d) with d the directory of d/e: no error")
		}
		if _, err := s.PutIfAbsent(ctx, "d", nil); err == nil {
			t.Fatal("PutIfAbsent(d) with d the directory of d/e: no error")
		}
	})
}

func TestMemoryClock(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	s := objstore.NewMemory(objstore.WithClock(func() time.Time { return now }))
	ctx := t.Context()
	if err := s.Put(ctx, "old", nil); err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	if _, err := s.PutIfAbsent(ctx, "new", nil); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]time.Time{"old": now.Add(-time.Hour), "new": now} {
		info, err := s.Head(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !info.Modified.Equal(want) {
			t.Errorf("Head(%q).Modified = %v, want %v", key, info.Modified, want)
		}
	}
}

func TestErrorMessages(t *testing.T) {
	s := objstore.NewMemory()
	_, err := s.Get(t.Context(), "a/b")
	if got, want := err.Error(), `objstore: get "a/b": object not found`; got != want {
		t.Errorf("error = %q, want %q", got, want)
	}
	var oe *objstore.Error
	if !errors.As(err, &oe) || oe.Op != "get" || oe.Key != "a/b" {
		t.Errorf("errors.As(*Error) = %+v", oe)
	}
	err = s.Put(t.Context(), "a/../b", nil)
	if got, want := err.Error(), `objstore: put "a/../b": invalid key: ".." segment`; got != want {
		t.Errorf("error = %q, want %q", got, want)
	}
}

func TestValidateKey(t *testing.T) {
	for _, key := range objstoretest.InvalidKeys {
		if err := objstore.ValidateKey(key); !errors.Is(err, objstore.ErrInvalidKey) {
			t.Errorf("ValidateKey(%q) = %v, want ErrInvalidKey", key, err)
		}
	}
	for _, key := range []string{"a", "a/b", "a.b/c..d", ".x", "x/.objstore", "日本/語", strings.Repeat("k", objstore.MaxKeyBytes)} {
		if err := objstore.ValidateKey(key); err != nil {
			t.Errorf("ValidateKey(%q) = %v, want nil", key, err)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	s3ok := objstore.S3Config{Bucket: "b"}
	for _, tc := range []struct {
		name string
		cfg  objstore.Config
		want string // "" for valid
	}{
		{"memory", objstore.Config{Backend: "memory"}, ""},
		{"fs", objstore.Config{Backend: "fs", Dir: "/tmp/x"}, ""},
		{"s3", objstore.Config{Backend: "s3", S3: s3ok}, ""},
		{"s3 full", objstore.Config{Backend: "s3", S3: objstore.S3Config{
			Bucket: "b", Prefix: "a/b/", Endpoint: "https://s3.example.com:9000", Region: "eu-west-1",
			AccessKey: "k", SecretKey: "s", MultipartThreshold: 64 << 20, PartSize: 16 << 20,
		}}, ""},
		{"no backend", objstore.Config{}, "backend is required"},
		{"unknown backend", objstore.Config{Backend: "gcs"}, `unknown backend "gcs"`},
		{"fs without dir", objstore.Config{Backend: "fs"}, "needs dir"},
		{"s3 without bucket", objstore.Config{Backend: "s3"}, "bucket is required"},
		{"s3 bucket with path", objstore.Config{Backend: "s3", S3: objstore.S3Config{Bucket: "b/p"}}, "contains '/'"},
		{"s3 bad prefix", objstore.Config{Backend: "s3", S3: objstore.S3Config{Bucket: "b", Prefix: "a/../b"}}, "prefix"},
		{"s3 bad endpoint", objstore.Config{Backend: "s3", S3: objstore.S3Config{Bucket: "b", Endpoint: "127.0.0.1:9000"}}, "endpoint"},
		{"s3 half credentials", objstore.Config{Backend: "s3", S3: objstore.S3Config{Bucket: "b", AccessKey: "k"}}, "go together"},
		{"s3 small parts", objstore.Config{Backend: "s3", S3: objstore.S3Config{Bucket: "b", PartSize: 1 << 20}}, "part_size"},
		{"s3 threshold below parts", objstore.Config{Backend: "s3", S3: objstore.S3Config{Bucket: "b", PartSize: 8 << 20, MultipartThreshold: 6 << 20}}, "multipart_threshold"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			if !errors.Is(err, objstore.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want ErrInvalidConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func TestOpen(t *testing.T) {
	ctx := t.Context()
	dir := filepath.Join(t.TempDir(), "fs")
	for _, cfg := range []objstore.Config{
		{Backend: "memory"},
		{Backend: "fs", Dir: dir},
	} {
		s, err := objstore.Open(ctx, cfg)
		if err != nil {
			t.Fatalf("Open(%+v): %v", cfg, err)
		}
		if err := s.Put(ctx, "k", []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "k")); err != nil {
		t.Fatalf("fs backend did not write under dir: %v", err)
	}
	s, err := objstore.Open(ctx, objstore.Config{Backend: "fs"})
	if err == nil || s != nil {
		t.Fatalf("Open of an invalid config = %v, %v; want nil and an error", s, err)
	}

	srv := sharedS3(t)
	srv.CreateBucket(t, "open")
	s, err = objstore.Open(ctx, objstore.Config{Backend: "s3", S3: srv.S3Config("open", "x")})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Put(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

// TestS3DefaultCredentialChain: without keys in the config the SDK's chain
// supplies them, here from the environment.
func TestS3DefaultCredentialChain(t *testing.T) {
	srv := sharedS3(t)
	srv.CreateBucket(t, "envcreds")
	t.Setenv("AWS_ACCESS_KEY_ID", srv.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", srv.SecretKey)
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(t.TempDir(), "none"))
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", filepath.Join(t.TempDir(), "none"))
	cfg := srv.S3Config("envcreds", "")
	cfg.AccessKey, cfg.SecretKey = "", ""
	s := newS3Store(t, cfg)
	if err := s.Put(t.Context(), "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
}

// TestS3ServerErrors: 5xx answers are failures of the store, never
// ErrNotFound, whatever the operation.
func TestS3ServerErrors(t *testing.T) {
	var requests atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprint(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>busy</Message></Error>`)
	}))
	defer srv.Close()
	s := newS3Store(t, objstore.S3Config{
		Bucket: "b", Endpoint: srv.URL, PathStyle: true, AccessKey: "k", SecretKey: "s",
	})
	ctx := t.Context()
	ops := map[string]func() error{
		"get":           func() error { _, err := s.Get(ctx, "k"); return err },
		"head":          func() error { _, err := s.Head(ctx, "k"); return err },
		"get-range":     func() error { _, err := s.GetRange(ctx, "k", 0, 1); return err },
		"put-if-absent": func() error { _, err := s.PutIfAbsent(ctx, "k", nil); return err },
		"put":           func() error { return s.Put(ctx, "k", nil) },
		"delete":        func() error { return s.Delete(ctx, "k") },
		"list":          func() error { return s.List(ctx, "", func(objstore.Info) error { return nil }) },
	}
	// In parallel: the SDK retries each with backoff, about 1.5 s.
	var wg sync.WaitGroup
	for op, call := range ops {
		wg.Go(func() {
			err := call()
			if err == nil || errors.Is(err, objstore.ErrNotFound) || errors.Is(err, objstore.ErrInvalidRange) {
				t.Errorf("%s against a failing server: %v, want an error that is neither ErrNotFound nor ErrInvalidRange", op, err)
			}
		})
	}
	wg.Wait()
	if requests.Load() == 0 {
		t.Fatal("no request reached the server")
	}
}

// TestS3ListPages lists across ListObjectsV2 pages, and stops mid-page.
func TestS3ListPages(t *testing.T) {
	srv := sharedS3(t)
	srv.CreateBucket(t, "pages")
	s := newS3Store(t, srv.S3Config("pages", "p"))
	objstore.SetListPage(s, 2)
	ctx := t.Context()
	want := []string{"a", "b/1", "b/2", "c", "d"}
	for _, key := range want {
		if err := s.Put(ctx, key, nil); err != nil {
			t.Fatal(err)
		}
	}
	var got []string
	if err := s.List(ctx, "", func(info objstore.Info) error { got = append(got, info.Key); return nil }); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("List in pages of 2 = %q, want %q", got, want)
	}
	stop := errors.New("stop")
	got = nil
	err := s.List(ctx, "", func(info objstore.Info) error {
		got = append(got, info.Key)
		if len(got) == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) || !slices.Equal(got, want[:3]) {
		t.Fatalf("List stopped at the third key: %q, %v", got, err)
	}
}

// TestLocation: stores name themselves for backups without credentials.
func TestLocation(t *testing.T) {
	dir := t.TempDir()
	fs, err := objstore.NewFS(dir)
	if err != nil {
		t.Fatal(err)
	}
	if loc, ep := fs.Location(); loc != dir || ep != "" {
		t.Fatalf("fs location %q %q, want %q", loc, ep, dir)
	}
	for _, tc := range []struct{ prefix, want string }{{"", "s3://bk"}, {"/a/b/", "s3://bk/a/b"}} {
		s, err := objstore.NewS3(t.Context(), objstore.S3Config{Bucket: "bk", Prefix: tc.prefix, Endpoint: "http://127.0.0.1:9", AccessKey: "id", SecretKey: "secret"})
		if err != nil {
			t.Fatal(err)
		}
		loc, ep := s.Location()
		if loc != tc.want || ep != "http://127.0.0.1:9" || strings.Contains(loc+ep, "secret") {
			t.Fatalf("s3 location %q %q, want %q", loc, ep, tc.want)
		}
	}
}
