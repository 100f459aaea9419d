package objstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/s3/manager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"
)

// deleteBatch is the most keys one DeleteObjects request may carry.
const deleteBatch = 1000

// gatewayRaceRetries bounds the retries of a write that an S3 gateway on a
// filesystem answered 409 ExistingObjectIsDirectory. versitygw (posix)
// answers that when a concurrent delete removed the object's parent
// directory, emptied, between its mkdir and its link; nothing was written,
// and the retry succeeds. (A key that really is the directory of other
// keys fails the same way after the retries.) AWS S3 never answers it.
const gatewayRaceRetries = 3

// conditionalConflictRetries bounds the retries of a PutIfAbsent that S3
// answered 409 ConditionalRequestConflict (a concurrent conditional write
// on the key was in flight); the retry then gets a definite answer.
const conditionalConflictRetries = 5

// S3 is a Store in an S3 bucket under a key prefix.
type S3 struct {
	client *s3.Client
	//lint:ignore SA1019 feature/s3/manager is the pinned uploader (docs: toolchain §1); its successor is feature/s3/transfermanager.
	uploader  *manager.Uploader
	bucket    string
	prefix    string // "" or the root prefix followed by '/'
	endpoint  string // "" for AWS
	threshold int64
	// listPage is ListObjectsV2's MaxKeys; 0 leaves it to the server
	// (1000). Tests lower it to exercise pagination.
	listPage int32
}

// s3IdleConnsPerHost is how many idle connections to the endpoint the
// store keeps for reuse. The SDK's default keeps 10, but a node runs up to
// storage.cold.flush_concurrency (32) uploads at once beside its cold reads
// and the cold GC: every burst above 10 would close the connections beyond
// them, to dial them anew for the next. Idle connections still close after
// the SDK's 90 s. (Against the bench's versitygw dialing stays at 3-5 % of
// a node's CPU whatever this is: that server answers every PUT with
// "Connection: close".)
const s3IdleConnsPerHost = 128

// NewS3 returns a store for cfg (validated, with defaults applied). It does
// no I/O against the bucket; a wrong bucket or credentials show up as
// errors of the first operations.
func NewS3(ctx context.Context, cfg S3Config) (*S3, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts := []func(*config.LoadOptions) error{
		// Without this every GET against a server that sends no checksum
		// (versitygw, MinIO, ...) logs a warning.
		config.WithResponseChecksumValidation(aws.ResponseChecksumValidationWhenRequired),
		config.WithHTTPClient(awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
			t.MaxIdleConnsPerHost = s3IdleConnsPerHost
		})),
	}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	} else {
		opts = append(opts, config.WithDefaultRegion(defaultS3Region))
	}
	if cfg.AccessKey != "" {
		opts = append(opts, config.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(cfg.AccessKey, cfg.SecretKey, "")))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("objstore: s3: load aws config: %w", err)
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
		o.UsePathStyle = cfg.PathStyle
		o.DisableLogOutputChecksumValidationSkipped = true
	})
	s := &S3{
		client:    client,
		bucket:    cfg.Bucket,
		endpoint:  cfg.Endpoint,
		threshold: cfg.MultipartThreshold,
	}
	if p := strings.Trim(cfg.Prefix, "/"); p != "" {
		s.prefix = p + "/"
	}
	//lint:ignore SA1019 feature/s3/manager is the pinned uploader (docs: toolchain §1); its successor is feature/s3/transfermanager.
	s.uploader = manager.NewUploader(client, func(u *manager.Uploader) {
		u.PartSize = cfg.PartSize
	})
	return s, nil
}

var _ Store = (*S3)(nil)

// Location names the store as s3://bucket/prefix (s3://bucket without a
// prefix), with its endpoint ("" for AWS); never credentials.
func (s *S3) Location() (location, endpoint string) {
	location = "s3://" + s.bucket
	if s.prefix != "" {
		location += "/" + strings.TrimSuffix(s.prefix, "/")
	}
	return location, s.endpoint
}

// Client returns the SDK client, for tests and tools that need more than
// Store (creating buckets, listing multipart uploads).
func (s *S3) Client() *s3.Client { return s.client }

func (s *S3) objectKey(key string) *string { return aws.String(s.prefix + key) }

// Put implements Store. A body above the multipart threshold goes up in
// parts of PartSize through manager.Uploader.
func (s *S3) Put(ctx context.Context, key string, body []byte) error {
	if err := ValidateKey(key); err != nil {
		return opError(opPut, key, err)
	}
	for attempt := 0; ; attempt++ {
		err := s.put(ctx, key, body, false)
		if err == nil {
			return nil
		}
		if code, _ := errorCode(err); code == "ExistingObjectIsDirectory" &&
			attempt < gatewayRaceRetries && ctx.Err() == nil {
			continue
		}
		return opError(opPut, key, classify(err))
	}
}

// PutIfAbsent implements Store with If-None-Match: * (on the
// CompleteMultipartUpload of a multipart upload); 412 PreconditionFailed
// means an object exists. As with any conditional write over a network, a
// request that succeeded but whose answer was lost is retried by the SDK
// and then answered 412: created is false for an object this call wrote.
// Callers that must know compare the stored body with theirs.
func (s *S3) PutIfAbsent(ctx context.Context, key string, body []byte) (bool, error) {
	if err := ValidateKey(key); err != nil {
		return false, opError(opPutIfAbsent, key, err)
	}
	for attempt := 0; ; attempt++ {
		err := s.put(ctx, key, body, true)
		if err == nil {
			return true, nil
		}
		switch code, status := errorCode(err); {
		case code == "PreconditionFailed" || status == http.StatusPreconditionFailed:
			return false, nil
		case code == "ConditionalRequestConflict" && attempt < conditionalConflictRetries && ctx.Err() == nil,
			code == "ExistingObjectIsDirectory" && attempt < gatewayRaceRetries && ctx.Err() == nil:
			continue
		}
		return false, opError(opPutIfAbsent, key, classify(err))
	}
}

func (s *S3) put(ctx context.Context, key string, body []byte, ifAbsent bool) error {
	in := &s3.PutObjectInput{
		Bucket:        aws.String(s.bucket),
		Key:           s.objectKey(key),
		Body:          bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))),
	}
	if ifAbsent {
		in.IfNoneMatch = aws.String("*")
	}
	if int64(len(body)) > s.threshold {
		//lint:ignore SA1019 feature/s3/manager is the pinned uploader (docs: toolchain §1); its successor is feature/s3/transfermanager.
		_, err := s.uploader.Upload(ctx, in)
		return err
	}
	_, err := s.client.PutObject(ctx, in)
	return err
}

// Get implements Store.
func (s *S3) Get(ctx context.Context, key string) ([]byte, error) {
	if err := ValidateKey(key); err != nil {
		return nil, opError(opGet, key, err)
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    s.objectKey(key),
	})
	if err != nil {
		return nil, opError(opGet, key, classify(err))
	}
	body, err := readBody(out)
	if err != nil {
		return nil, opError(opGet, key, err)
	}
	return body, nil
}

// GetRange implements Store with a Range request; 416 InvalidRange means
// off is at or past the end.
func (s *S3) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if err := ValidateKey(key); err != nil {
		return nil, opError(opGetRange, key, err)
	}
	if err := checkRange(off, n); err != nil {
		return nil, opError(opGetRange, key, err)
	}
	last := off + n - 1
	if last < off { // overflow: to the end
		last = 1<<63 - 1
	}
	out, err := s.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    s.objectKey(key),
		Range:  aws.String(fmt.Sprintf("bytes=%d-%d", off, last)),
	})
	if err != nil {
		return nil, opError(opGetRange, key, classify(err))
	}
	ranged := out.ContentRange != nil
	body, err := readBody(out)
	if err != nil {
		return nil, opError(opGetRange, key, err)
	}
	if !ranged {
		// The whole object (a server that ignores Range, or an empty
		// object): cut the range out here.
		size := int64(len(body))
		if off >= size {
			return nil, opError(opGetRange, key, pastEnd(off, size))
		}
		body = body[off:rangeEnd(off, n, size)]
	}
	return body, nil
}

func readBody(out *s3.GetObjectOutput) ([]byte, error) {
	defer out.Body.Close()
	var buf bytes.Buffer
	if n := aws.ToInt64(out.ContentLength); n > 0 {
		buf.Grow(int(n))
	}
	if _, err := buf.ReadFrom(out.Body); err != nil {
		return nil, fmt.Errorf("read body: %w", err)
	}
	return buf.Bytes(), nil
}

// Head implements Store.
func (s *S3) Head(ctx context.Context, key string) (Info, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, opError(opHead, key, err)
	}
	out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{
		Bucket: aws.String(s.bucket),
		Key:    s.objectKey(key),
	})
	if err != nil {
		return Info{}, opError(opHead, key, classify(err))
	}
	return Info{Key: key, Size: aws.ToInt64(out.ContentLength), Modified: aws.ToTime(out.LastModified)}, nil
}

// List implements Store with ListObjectsV2, page by page; S3 returns keys
// in UTF-8 byte order, which is Go's string order.
func (s *S3) List(ctx context.Context, prefix string, fn func(Info) error) error {
	if err := validatePrefix(prefix); err != nil {
		return opError(opList, prefix, err)
	}
	in := &s3.ListObjectsV2Input{
		Bucket: aws.String(s.bucket),
		Prefix: aws.String(s.prefix + prefix),
	}
	if s.listPage > 0 {
		in.MaxKeys = aws.Int32(s.listPage)
	}
	pages := s3.NewListObjectsV2Paginator(s.client, in)
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return opError(opList, prefix, classify(err))
		}
		for _, obj := range page.Contents {
			key, ok := strings.CutPrefix(aws.ToString(obj.Key), s.prefix)
			if !ok || ValidateKey(key) != nil {
				continue // not written through a Store
			}
			info := Info{Key: key, Size: aws.ToInt64(obj.Size), Modified: aws.ToTime(obj.LastModified)}
			if err := fn(info); err != nil {
				return err
			}
		}
	}
	return nil
}

// Delete implements Store with DeleteObjects, 1000 keys a request. Every
// batch is tried; the error joins the keys S3 could not delete.
func (s *S3) Delete(ctx context.Context, keys ...string) error {
	for _, key := range keys {
		if err := ValidateKey(key); err != nil {
			return opError(opDelete, key, err)
		}
	}
	var errs []error
	for batch := range slices.Chunk(keys, deleteBatch) {
		ids := make([]types.ObjectIdentifier, len(batch))
		for i, key := range batch {
			ids[i] = types.ObjectIdentifier{Key: s.objectKey(key)}
		}
		out, err := s.client.DeleteObjects(ctx, &s3.DeleteObjectsInput{
			Bucket: aws.String(s.bucket),
			Delete: &types.Delete{Objects: ids, Quiet: aws.Bool(true)},
		})
		if err != nil {
			what := batch[0]
			if len(batch) > 1 {
				what = fmt.Sprintf("%s (and %d more)", batch[0], len(batch)-1)
			}
			errs = append(errs, opError(opDelete, what, classify(err)))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		for _, e := range out.Errors {
			key := strings.TrimPrefix(aws.ToString(e.Key), s.prefix)
			errs = append(errs, opError(opDelete, key,
				fmt.Errorf("%s: %s", aws.ToString(e.Code), aws.ToString(e.Message))))
		}
	}
	return errors.Join(errs...)
}

// errorCode returns the S3 error code and HTTP status of an SDK error (""
// and 0 when it has none, as with a refused connection).
func errorCode(err error) (code string, status int) {
	var apiErr smithy.APIError
	if errors.As(err, &apiErr) {
		code = apiErr.ErrorCode()
	}
	var respErr interface{ HTTPStatusCode() int }
	if errors.As(err, &respErr) {
		status = respErr.HTTPStatusCode()
	}
	return code, status
}

// classify maps the S3 answers that are about the object to the package's
// sentinels, keeping the SDK error in the chain: NoSuchKey, NotFound and
// 404 to ErrNotFound (but not NoSuchBucket: a missing bucket is a broken
// configuration, not a missing object), InvalidRange and 416 to
// ErrInvalidRange. Everything else (connection errors, 5xx, access denied)
// stays as it is.
func classify(err error) error {
	code, status := errorCode(err)
	switch {
	case code == "NoSuchBucket":
		return err
	case code == "NoSuchKey" || code == "NotFound" || status == http.StatusNotFound:
		return fmt.Errorf("%w (%w)", ErrNotFound, err)
	case code == "InvalidRange" || status == http.StatusRequestedRangeNotSatisfiable:
		return fmt.Errorf("%w (%w)", ErrInvalidRange, err)
	}
	return err
}
