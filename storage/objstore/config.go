package objstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// Backends that Open knows.
const (
	BackendFS     = "fs"
	BackendS3     = "s3"
	BackendMemory = "memory"
)

const (
	defaultS3Region           = "us-east-1"
	defaultMultipartThreshold = 16 << 20
	defaultPartSize           = 8 << 20
	// minPartSize and maxPartSize are S3's limits on a part (the last
	// part may be smaller); maxPutSize is the largest single PutObject.
	minPartSize = 5 << 20
	maxPartSize = 5 << 30
	maxPutSize  = 5 << 30
)

// Config selects and configures an object store.
type Config struct {
	// Backend is "fs" (files under Dir), "s3" (a bucket, see S3) or
	// "memory" (lost when the process ends; for tests).
	Backend string `toml:"backend"`
	// Dir is the fs backend's root directory; created if missing. The
	// application sets it from storage.cold.root.
	Dir string `toml:"-"`
	// S3 configures the s3 backend.
	S3 S3Config `toml:"s3"`
}

// S3Config configures the s3 backend. The credentials, when not set here,
// come from the SDK's default chain: AWS_ACCESS_KEY_ID and
// AWS_SECRET_ACCESS_KEY, the shared config files, an instance role.
type S3Config struct {
	// Bucket holds the objects (required; it must exist).
	Bucket string `toml:"bucket"`
	// Prefix is the store's root inside the bucket: the key k is the S3
	// key Prefix+"/"+k, or k when Prefix is empty. Leading and trailing
	// slashes are ignored. The application sets it from
	// storage.cold.root.
	Prefix string `toml:"-"`
	// Endpoint is the URL of an S3-compatible service
	// (http://127.0.0.1:7070); empty means AWS (or AWS_ENDPOINT_URL_S3).
	Endpoint string `toml:"endpoint"`
	// Region signs the requests; empty means the SDK's (AWS_REGION, the
	// shared config), else us-east-1.
	Region string `toml:"region"`
	// PathStyle addresses the bucket in the path (http://host/bucket/key)
	// instead of the host name; most S3-compatible services need it.
	PathStyle bool `toml:"path_style"`
	// AccessKey and SecretKey are static credentials; both or neither.
	AccessKey string `toml:"access_key"`
	SecretKey string `toml:"secret_key"`
	// MultipartThreshold is the body size above which Put and PutIfAbsent
	// upload in parts; default 16 MiB, at most 5 GiB, at least PartSize.
	MultipartThreshold int64 `toml:"multipart_threshold"`
	// PartSize is the size of each part of a multipart upload; default
	// 8 MiB, between 5 MiB and 5 GiB.
	PartSize int64 `toml:"part_size"`
}

// withDefaults fills in the zero sizes.
func (c S3Config) withDefaults() S3Config {
	if c.PartSize == 0 {
		c.PartSize = defaultPartSize
	}
	if c.MultipartThreshold == 0 {
		c.MultipartThreshold = max(defaultMultipartThreshold, c.PartSize)
	}
	return c
}

// Validate reports every problem of the configuration; zero sizes are
// taken as their defaults. The error wraps ErrInvalidConfig.
func (c S3Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: s3: "+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if c.Bucket == "" {
		add("bucket is required")
	} else if strings.Contains(c.Bucket, "/") {
		add("bucket %q contains '/' (put the path in prefix)", c.Bucket)
	}
	if p := strings.Trim(c.Prefix, "/"); p != "" {
		if err := ValidateKey(p); err != nil {
			add("prefix %q: %v", c.Prefix, strings.TrimPrefix(err.Error(), "objstore: "))
		}
	}
	if c.Endpoint != "" {
		u, err := url.Parse(c.Endpoint)
		switch {
		case err != nil:
			add("endpoint %q: %v", c.Endpoint, err)
		case u.Scheme != "http" && u.Scheme != "https" || u.Host == "":
			add("endpoint %q: want http://host[:port] or https://host[:port]", c.Endpoint)
		}
	}
	if (c.AccessKey == "") != (c.SecretKey == "") {
		add("access_key and secret_key go together (or leave both empty for the default credential chain)")
	}
	if c.PartSize < minPartSize || c.PartSize > maxPartSize {
		add("part_size %d: want 5 MiB (%d) to 5 GiB", c.PartSize, int64(minPartSize))
	}
	if c.MultipartThreshold < c.PartSize || c.MultipartThreshold > maxPutSize {
		add("multipart_threshold %d: want part_size (%d) to 5 GiB", c.MultipartThreshold, c.PartSize)
	}
	return errors.Join(errs...)
}

// Validate reports every problem of the configuration of the selected
// backend. The error wraps ErrInvalidConfig.
func (c Config) Validate() error {
	switch c.Backend {
	case BackendFS:
		if c.Dir == "" {
			return fmt.Errorf("%w: backend fs needs dir", ErrInvalidConfig)
		}
	case BackendS3:
		return c.S3.Validate()
	case BackendMemory:
	case "":
		return fmt.Errorf("%w: backend is required (fs, s3 or memory)", ErrInvalidConfig)
	default:
		return fmt.Errorf("%w: unknown backend %q (want fs, s3 or memory)", ErrInvalidConfig, c.Backend)
	}
	return nil
}

// Open validates cfg and returns the store of its backend.
func Open(ctx context.Context, cfg Config) (Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Each case returns a nil Store on error, never a typed nil.
	switch cfg.Backend {
	case BackendFS:
		s, err := NewFS(cfg.Dir)
		if err != nil {
			return nil, err
		}
		return s, nil
	case BackendS3:
		s, err := NewS3(ctx, cfg.S3)
		if err != nil {
			return nil, err
		}
		return s, nil
	default:
		return NewMemory(), nil
	}
}
