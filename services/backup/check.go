package backup

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/ursula/ursula/storage/backupfmt"
	"github.com/ursula/ursula/storage/coldfmt"
)

// chunkTailBytes is the fixed end of a chunk footer, which starts with the
// chunk's data length (storage/coldfmt/doc.go).
const chunkTailBytes = 24

// verifyRef checks a cold object's body against what the referencing
// snapshot says of it, so that a backup never takes damaged bytes and
// gives them a fresh BLAKE3 digest. A crc32c check is a page's body CRC or
// a chunk's footer CRC (with every data block); a sha256 check a snapshot
// part's digest. A check of a kind this build does not know is left to
// the restored cluster's own reads.
func verifyRef(ref backupfmt.Ref, body []byte) error {
	if ref.Size != 0 && uint64(len(body)) != ref.Size {
		return fmt.Errorf("%d bytes, the reference says %d", len(body), ref.Size)
	}
	kind, want, ok := strings.Cut(ref.Check, ":")
	if !ok {
		return nil
	}
	switch kind {
	case "crc32c":
		v, err := strconv.ParseUint(want, 16, 32)
		if err != nil {
			return fmt.Errorf("unreadable check %q", ref.Check)
		}
		crc := uint32(v)
		if coldfmt.PageChecksum(body) == crc {
			return nil // an index page
		}
		if len(body) < chunkTailBytes {
			return fmt.Errorf("%d bytes match neither a page nor a chunk of checksum %08x", len(body), crc)
		}
		n := binary.LittleEndian.Uint64(body[len(body)-chunkTailBytes:])
		if n > uint64(len(body)) {
			return fmt.Errorf("not a page of checksum %08x, and as a chunk its footer names %d data bytes in %d", crc, n, len(body))
		}
		if _, _, err := coldfmt.DecodeChunk(0, n, body, crc); err != nil {
			return fmt.Errorf("not a page of checksum %08x, and as a chunk: %v", crc, err)
		}
		return nil
	case "sha256":
		sum := sha256.Sum256(body)
		if got := hex.EncodeToString(sum[:]); got != want {
			return fmt.Errorf("SHA-256 %s, the reference says %s", got, want)
		}
		return nil
	}
	return nil
}
