package e2e

import (
	"testing"
	"time"

	"github.com/ursula/ursula/storage/objstore/objstoretest"
)

// ColdS3Args are the flags and environment that make a spawned server keep
// its cold tier in bucket (created here) of a test S3 server, under prefix.
// Credentials go through the environment, as the SDK's default chain
// reads them in production.
func ColdS3Args(t testing.TB, s3 *objstoretest.S3Server, bucket, prefix string) (args, env []string) {
	s3.CreateBucket(t, bucket)
	args = []string{
		"-storage.cold.backend=s3",
		"-storage.cold.s3.bucket=" + bucket,
		"-storage.cold.s3.endpoint=" + s3.Endpoint,
		"-storage.cold.s3.region=us-east-1",
		"-storage.cold.s3.path_style",
	}
	if prefix != "" {
		args = append(args, "-storage.cold.root="+prefix)
	}
	env = []string{"AWS_ACCESS_KEY_ID=" + s3.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3.SecretKey}
	return args, env
}

// TinyFlushArgs make a server flush every stream within milliseconds into
// chunks of a few KiB and read them back through a tiny cache, so that
// reads constantly cross the cold/hot boundary.
var TinyFlushArgs = []string{
	"-storage.cold.flush_bytes=2048",
	"-storage.cold.flush_age=20ms",
	"-storage.cold.group_flush_bytes=4096",
	"-storage.cold.max_chunk_bytes=4096",
	"-runtime.external_payload_min_size=32768",
	"-storage.cold.flush_interval=10ms",
	"-storage.cold.block_bytes=1024",
	"-storage.cold.cache_bytes=16384",
}

// NodeMetrics fetches the /__ursula/metrics document of the server's node
// (the server.listen listener of an all-in-one or node process) as a map.
func (s *Server) NodeMetrics(tb testing.TB) map[string]any {
	tb.Helper()
	addr := s.Addrs["server.listen"]
	if addr == "" {
		tb.Fatalf("server %s has no server.listen listener", s.Bin)
	}
	var m map[string]any
	if _, err := getJSON(tb.Context(), s.HTTPClient(3*time.Second), s.scheme()+addr+"/__ursula/metrics", &m); err != nil {
		tb.Fatal(err)
	}
	return m
}

// TinyFlushTOML is TinyFlushArgs as [storage.cold] keys, for cluster
// nodes, with TinyFlushRuntimeTOML as their [runtime] keys.
const TinyFlushTOML = `flush_bytes = 2048
flush_age = "20ms"
group_flush_bytes = 4096
max_chunk_bytes = 4096
flush_interval = "10ms"
block_bytes = 1024
cache_bytes = 16384`

// TinyFlushRuntimeTOML is the [runtime] part of TinyFlushArgs.
const TinyFlushRuntimeTOML = `external_payload_min_size = 32768`
