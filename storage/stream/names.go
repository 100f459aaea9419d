package stream

import (
	"unicode/utf8"

	"github.com/ursula/ursula/storage/fault"
)

// Name limits.
const (
	// MaxStreamIDBytes bounds a stream id.
	MaxStreamIDBytes = 1024
	// MaxBucketBytes bounds a bucket name.
	MaxBucketBytes = 63
)

// Validate checks a stream's names: lengths, UTF-8, and no control
// character in the stream id. Every request naming a stream, and every
// command a peer forwards, passes it before it is proposed.
func (k Key) Validate() error {
	if k.Bucket == "" || len(k.Bucket) > MaxBucketBytes {
		return fault.Errorf(fault.ErrInvalidArgument, "bucket name must be 1 to %d bytes", MaxBucketBytes)
	}
	if k.Stream == "" || len(k.Stream) > MaxStreamIDBytes {
		return fault.Errorf(fault.ErrInvalidArgument, "stream id must be 1 to %d bytes", MaxStreamIDBytes)
	}
	if !utf8.ValidString(k.Stream) || !utf8.ValidString(k.Bucket) {
		return fault.Errorf(fault.ErrInvalidArgument, "names must be valid UTF-8")
	}
	for _, r := range k.Stream {
		if r < 0x20 || r == 0x7f {
			return fault.Errorf(fault.ErrInvalidArgument, "stream id contains a control character")
		}
	}
	return nil
}
