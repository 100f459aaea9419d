package backup

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/ursula/ursula/storage/objstore"
)

// Location is where backups live: an object store holding the layout
// doc.go describes. It is safe for concurrent use.
type Location struct {
	store objstore.Store
	name  string
}

// OpenLocation opens a location named by spec:
//
//   - "s3://bucket/prefix": an S3 bucket (the prefix may be empty) through
//     the AWS SDK's credential chain and AWS_REGION; AWS_ENDPOINT_URL_S3 or
//     AWS_ENDPOINT_URL selects an S3-compatible service, addressed in the
//     path style that such services need;
//   - "file:///abs/dir" or a plain path: a local directory (created if
//     missing).
//
// It does no I/O against S3: a wrong bucket or missing credentials show up
// in the first operation.
func OpenLocation(ctx context.Context, spec string) (*Location, error) {
	endpoint := os.Getenv("AWS_ENDPOINT_URL_S3")
	if endpoint == "" {
		endpoint = os.Getenv("AWS_ENDPOINT_URL")
	}
	return openLocation(ctx, spec, endpoint)
}

// openLocation opens spec; endpoint, when set, is the S3-compatible
// service an s3:// spec lives in.
func openLocation(ctx context.Context, spec, endpoint string) (*Location, error) {
	spec = strings.TrimSpace(spec)
	switch {
	case spec == "":
		return nil, errors.New("backup: empty location (want s3://bucket/prefix, file:///dir or a directory)")
	case strings.HasPrefix(spec, "s3://"):
		bucket, prefix, _ := strings.Cut(strings.TrimPrefix(spec, "s3://"), "/")
		prefix = strings.Trim(prefix, "/")
		if bucket == "" {
			return nil, fmt.Errorf("backup: location %q names no bucket (want s3://bucket/prefix)", spec)
		}
		cfg := objstore.S3Config{Bucket: bucket, Prefix: prefix, Endpoint: endpoint, PathStyle: endpoint != ""}
		store, err := objstore.NewS3(ctx, cfg)
		if err != nil {
			return nil, fmt.Errorf("backup: location %s: %w", spec, err)
		}
		name := "s3://" + bucket
		if prefix != "" {
			name += "/" + prefix
		}
		return &Location{store: store, name: name}, nil
	case strings.HasPrefix(spec, "file://"):
		u, err := url.Parse(spec)
		if err != nil {
			return nil, fmt.Errorf("backup: location %q: %w", spec, err)
		}
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("backup: location %q names host %q: want file:///absolute/dir", spec, u.Host)
		}
		if !filepath.IsAbs(u.Path) {
			return nil, fmt.Errorf("backup: location %q: want file:///absolute/dir", spec)
		}
		return openDir(u.Path)
	case strings.Contains(spec, "://"):
		return nil, fmt.Errorf("backup: location %q: unsupported scheme (want s3://bucket/prefix, file:///dir or a directory)", spec)
	default:
		return openDir(spec)
	}
}

func openDir(dir string) (*Location, error) {
	store, err := objstore.NewFS(dir)
	if err != nil {
		return nil, fmt.Errorf("backup: location %s: %w", dir, err)
	}
	return &Location{store: store, name: store.Dir()}, nil
}

// NewLocation is a location over an object store already open (tests,
// tools holding a store); name is what String returns.
func NewLocation(store objstore.Store, name string) *Location {
	return &Location{store: store, name: name}
}

// String names the location: s3://bucket/prefix or an absolute directory.
func (l *Location) String() string { return l.name }

// Store is the object store under the location.
func (l *Location) Store() objstore.Store { return l.store }

// Keys of the layout (doc.go).
const (
	lockKey        = "lock"
	takeoverPrefix = "lock-takeover/"
	backupsPrefix  = "backups/"
	objectsPrefix  = "objects/"
	manifestName   = "manifest.json"
)

func backupPrefix(id string) string    { return backupsPrefix + id + "/" }
func manifestKey(id string) string     { return backupPrefix(id) + manifestName }
func groupKey(id string, g int) string { return fmt.Sprintf("%sgroups/%05d.bin", backupPrefix(id), g) }
func objectKey(digest string) string   { return objectsPrefix + digest[:2] + "/" + digest }

// validID reports whether id can name a backup: one key segment of
// letters, digits, '.', '_' and '-', not starting with '.', at most 128
// bytes.
func validID(id string) error {
	if id == "" || len(id) > 128 || id[0] == '.' {
		return fmt.Errorf("backup: id %q: want 1 to 128 letters, digits, '.', '_' or '-', not starting with '.'", id)
	}
	for _, c := range []byte(id) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("backup: id %q: want 1 to 128 letters, digits, '.', '_' or '-', not starting with '.'", id)
		}
	}
	return nil
}

// readManifest reads the manifest of backup id: ErrNotFound when the
// backup is not complete (or does not exist), ErrCorrupt when it does not
// decode.
func (l *Location) readManifest(ctx context.Context, id string) (*Manifest, error) {
	if err := validID(id); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotFound, err)
	}
	key := manifestKey(id)
	body, err := l.store.Get(ctx, key)
	if errors.Is(err, objstore.ErrNotFound) {
		return nil, fmt.Errorf("%w: no complete backup %q in %s", ErrNotFound, id, l)
	}
	if err != nil {
		return nil, fmt.Errorf("read manifest: %w", err)
	}
	var m Manifest
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrCorrupt, key, err)
	}
	if m.ID != id {
		return nil, fmt.Errorf("%w: %s names backup %q", ErrCorrupt, key, m.ID)
	}
	return &m, nil
}

// backupIDs lists the ids under backups/, and whether each is complete
// (has its manifest), in id order.
func (l *Location) backupIDs(ctx context.Context) (ids []string, complete map[string]bool, err error) {
	complete = map[string]bool{}
	seen := map[string]bool{}
	err = l.store.List(ctx, backupsPrefix, func(info objstore.Info) error {
		id, rest, ok := strings.Cut(strings.TrimPrefix(info.Key, backupsPrefix), "/")
		if !ok {
			return nil
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
		if rest == manifestName {
			complete[id] = true
		}
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("list backups: %w", err)
	}
	slices.Sort(ids)
	return ids, complete, nil
}

// List returns the complete backups of the location, oldest first (by
// created_at, then id). A manifest that does not decode fails the listing
// (ErrCorrupt): a tool that deletes by the listing must not act on part of
// it.
func List(ctx context.Context, loc *Location) ([]*Manifest, error) {
	ids, complete, err := loc.backupIDs(ctx)
	if err != nil {
		return nil, err
	}
	var out []*Manifest
	for _, id := range ids {
		if !complete[id] {
			continue
		}
		m, err := loc.readManifest(ctx, id)
		if errors.Is(err, ErrNotFound) {
			continue // removed since the listing
		}
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	slices.SortStableFunc(out, func(a, b *Manifest) int {
		if c := a.CreatedAt.Compare(b.CreatedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out, nil
}

// latest returns the newest complete backup.
func latest(ctx context.Context, loc *Location) (*Manifest, error) {
	all, err := List(ctx, loc)
	if err != nil {
		return nil, err
	}
	if len(all) == 0 {
		return nil, fmt.Errorf("%w: no complete backup in %s", ErrNotFound, loc)
	}
	return all[len(all)-1], nil
}

// manifestOf returns backup id, or the newest complete one for "".
// ReadManifest reads the manifest of backup id in loc ("" for the latest
// complete one; an id or its manifest's key backups/<id>/manifest.json).
func ReadManifest(ctx context.Context, loc *Location, id string) (*Manifest, error) {
	return manifestOf(ctx, loc, id)
}

func manifestOf(ctx context.Context, loc *Location, id string) (*Manifest, error) {
	if id == "" {
		return latest(ctx, loc)
	}
	// The manifest's key names the backup too (backups/<id>/manifest.json).
	if rest, ok := strings.CutPrefix(id, "backups/"); ok {
		if inner, ok := strings.CutSuffix(rest, "/manifest.json"); ok {
			id = inner
		}
	}
	return loc.readManifest(ctx, id)
}
