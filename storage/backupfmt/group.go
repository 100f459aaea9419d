package backupfmt

import (
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/zeebo/blake3"
	"google.golang.org/protobuf/proto"

	backupv1 "github.com/ursula/ursula/proto/gen/go/ursula/backup/v1"
	storagev1 "github.com/ursula/ursula/proto/gen/go/ursula/storage/v1"
)

// FormatVersion is the backup format: GroupObject.format_version, the
// manifest's format_version and GET /__ursula/backup/info. A node imports
// only group objects of this version, and a restore refuses a manifest or
// a cluster of another.
const FormatVersion = 1

// ErrCorrupt reports a group object or snapshot that does not decode or
// breaks an invariant of the format.
var ErrCorrupt = errors.New("backupfmt: corrupt")

// ErrVersion reports a group object of another format version.
var ErrVersion = errors.New("backupfmt: format version")

// Digest is the lower-case hex BLAKE3-256 digest of b.
func Digest(b []byte) string {
	sum := blake3.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// ValidDigest reports whether s has the form Digest returns.
func ValidDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range []byte(s) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// EncodeGroup encodes a group object deterministically.
func EncodeGroup(g *backupv1.GroupObject) ([]byte, error) {
	return proto.MarshalOptions{Deterministic: true}.Marshal(g)
}

// DecodeGroup decodes a group object and the snapshot it holds, refusing
// another format version (ErrVersion) and anything that does not decode or
// validate (ErrCorrupt).
func DecodeGroup(b []byte) (*backupv1.GroupObject, *storagev1.Snapshot, error) {
	var g backupv1.GroupObject
	if err := proto.Unmarshal(b, &g); err != nil {
		return nil, nil, fmt.Errorf("%w: decode group object: %v", ErrCorrupt, err)
	}
	if v := g.GetFormatVersion(); v != FormatVersion {
		return nil, nil, fmt.Errorf("%w: group object of format version %d, this build reads %d", ErrVersion, v, FormatVersion)
	}
	if g.GetGroupCount() == 0 || g.GetGroup() >= g.GetGroupCount() {
		return nil, nil, fmt.Errorf("%w: group %d of %d", ErrCorrupt, g.GetGroup(), g.GetGroupCount())
	}
	var snap storagev1.Snapshot
	if err := proto.Unmarshal(g.GetSnapshot(), &snap); err != nil {
		return nil, nil, fmt.Errorf("%w: decode the snapshot of group %d: %v", ErrCorrupt, g.GetGroup(), err)
	}
	if err := ValidateSnapshot(&snap); err != nil {
		return nil, nil, fmt.Errorf("%w: group %d: %v", ErrCorrupt, g.GetGroup(), err)
	}
	return &g, &snap, nil
}
