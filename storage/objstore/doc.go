// Package objstore is the object-store seam of the cold tier: one narrow
// interface, Store, with three implementations that behave the same:
//
//   - Memory (NewMemory): a map, for tests; WithClock sets the time that
//     stamps Info.Modified, so age-based logic (orphan collection) can be
//     tested.
//   - FS (NewFS): files under a directory, for single-node deployments and
//     tests.
//   - S3 (NewS3): a bucket of AWS S3 or an S3-compatible service (versitygw,
//     MinIO), through aws-sdk-go-v2.
//
// Open builds one from a Config (the [storage.cold] section: backend,
// root, s3.*). The contract
// they share is executable: objstoretest.Contract runs the same suite
// against all three, S3 against a real versitygw process.
//
// # Keys
//
// A Store is a flat key space under one root (the FS directory, or the S3
// bucket plus Prefix: the key k is the S3 key Prefix+"/"+k). Keys use '/'
// as the separator and are checked by ValidateKey, the same in every store
// and before any I/O, so a key accepted by one store is accepted by all:
//
//   - valid UTF-8, 1 to MaxKeyBytes (1024) bytes;
//   - no leading '/', no empty segment (so no trailing '/' and no "//"),
//     no "." or ".." segment;
//   - no backslash, NUL or other control character;
//   - no segment starting with ".objstore-tmp" (the FS store's temp files).
//
// Characters that need escaping in a URL (space, '%', '?', '#', '+') and
// any Unicode are fine. List takes any prefix, on a '/' boundary or not
// ("a/b" lists "a/b!", "a/b/c" and "a/bc"), and lists recursively in key
// order, which is byte order (Go string order, S3's UTF-8 binary order).
//
// One rule is not checked but must be kept for portability: no key may
// also be the directory of another key ("a/b" and "a/b/c"). S3 allows it;
// the FS store, and S3 gateways that store objects as files (versitygw's
// posix backend), reject the second write.
//
// # Errors
//
// Every error a Store method returns is an *Error naming the operation and
// the key, e.g. `objstore: get "a/b": object not found`. Its cause tells
// answers about the object from failures of the store:
//
//   - ErrNotFound: no object has the key (Get, GetRange, Head). For S3:
//     NoSuchKey, NotFound or 404, but not NoSuchBucket.
//   - ErrInvalidRange: GetRange at or past the end, or with off < 0 or
//     n <= 0. For S3: 416 InvalidRange.
//   - ErrInvalidKey: the key (or List prefix) breaks the rules above.
//   - anything else (a refused connection, a 5xx after the SDK's retries,
//     access denied, a full disk, a canceled context) is a failure: the
//     object may well exist. Callers must not treat it as "missing".
//
// PutIfAbsent's "exists" is not an error: it returns created=false (S3:
// 412 PreconditionFailed to If-None-Match: *). On S3, a write whose answer
// was lost and that the SDK retried also reads as created=false; a caller
// that must tell "I won" from "someone else won" compares the stored body
// with its own. Delete of a missing key is not an error. List returns fn's
// error itself, unwrapped.
//
// # Durability and atomicity
//
// An object is replaced whole: a reader sees the old or the new body,
// never a mix. The FS store writes a temp file (".objstore-tmp-*") in the
// object's directory, fsyncs it, renames it over the final name and fsyncs
// the directory (directories it creates are fsynced into their parents
// too), so after a crash an object is whole under its name or absent;
// temp files a crash leaves behind are never listed. Its PutIfAbsent links
// the synced temp file to the final name with link(2), which fails when
// the name exists, so of concurrent callers exactly one wins, as with S3's
// If-None-Match. Delete removes the directories it empties (never the
// root). S3 is as durable as the service; bodies above
// S3Config.MultipartThreshold go up as a multipart upload in PartSize parts,
// which S3 makes visible only when complete.
//
// # Modification times
//
// Info.Modified is the time of the last write: the Memory store's clock,
// the file's mtime, or S3's Last-Modified, which Head reports in whole
// seconds (List in milliseconds). Compare it with a slack of a second or
// two, and mind that S3's clock is the server's.
package objstore
