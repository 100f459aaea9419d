package stream

import (
	"fmt"

	"github.com/ursula/ursula/storage/fault"
)

// Offset sentinels accepted on reads.
const (
	OffsetStart = "-1"
	OffsetNow   = "now"
)

// FormatOffset renders a byte position as the protocol's offset token,
// "%016d_%016d": a read sequence (always 0 today, reserved) and the byte
// position in the stream's stored form. Tokens compare lexicographically in
// position order.
func FormatOffset(pos uint64) string {
	var b [33]byte
	for i := range 16 {
		b[i] = '0'
	}
	b[16] = '_'
	v := pos
	for i := 32; i >= 17; i-- {
		b[i] = byte('0' + v%10)
		v /= 10
	}
	if v != 0 { // more than 16 digits: fall back to the wide form
		return fmt.Sprintf("%016d_%016d", 0, pos)
	}
	return string(b[:])
}

// ParsedOffset is a parsed offset token.
type ParsedOffset struct {
	Start bool   // "-1"
	Now   bool   // "now"
	Pos   uint64 // byte position otherwise
}

// ParseOffset parses "-1", "now" or "<digits>_<digits>". Anything else is an
// INVALID_ARGUMENT error; nothing is ever partially accepted.
func ParseOffset(s string) (ParsedOffset, error) {
	switch s {
	case OffsetStart:
		return ParsedOffset{Start: true}, nil
	case OffsetNow:
		return ParsedOffset{Now: true}, nil
	}
	sep := -1
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '_' {
			if sep >= 0 {
				return ParsedOffset{}, badOffset(s)
			}
			sep = i
			continue
		}
		if c < '0' || c > '9' {
			return ParsedOffset{}, badOffset(s)
		}
	}
	if sep <= 0 || sep == len(s)-1 || len(s)-sep-1 > 19 || sep > 19 {
		return ParsedOffset{}, badOffset(s)
	}
	var pos uint64
	for i := sep + 1; i < len(s); i++ {
		d := uint64(s[i] - '0')
		if pos > (1<<64-1-d)/10 {
			return ParsedOffset{}, badOffset(s)
		}
		pos = pos*10 + d
	}
	return ParsedOffset{Pos: pos}, nil
}

func badOffset(s string) error {
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return fault.Errorf(fault.ErrInvalidArgument, "malformed offset %q: want -1, now or <seq>_<position>", s)
}

// Trimmed is the error of a read of m below its retention: it names the
// retention, where the stream now starts.
func Trimmed(m Meta, pos uint64) error {
	return fault.Errorf(fault.ErrOffsetTrimmed, "offset %s is below the stream's retention %s", FormatOffset(pos), FormatOffset(m.Retained)).
		With(fault.DetailNextOffset, FormatOffset(m.Retained))
}
