package powerloss

import (
	"bytes"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// OverwriteSector is the unit in which Writeback keeps the bytes a file
// overwrote in place: a disk writes whole 512-byte sectors, so such a
// write is never kept up to a byte in the middle of one. Bytes appended
// past what the file held durably are kept to any length (the file's size
// is metadata of its own).
const OverwriteSector = 512

// SectorSize is the unit of a torn write: a tear never crosses the end of
// the 4 KiB sector it starts in.
const SectorSize = 4096

// Tear is what the torn region of a file holds after a loss.
type Tear int

const (
	// NoTear: a file ends where what it kept ends.
	NoTear Tear = iota
	// TearZeros: the region reads as zeros (the length reached the disk,
	// the data did not).
	TearZeros
	// TearGarbage: the region holds seeded pseudo-random bytes (a sector
	// written partially, or stale blocks).
	TearGarbage
)

func (t Tear) String() string {
	switch t {
	case NoTear:
		return "none"
	case TearZeros:
		return "zeros"
	case TearGarbage:
		return "garbage"
	}
	return fmt.Sprintf("Tear(%d)", int(t))
}

// Loss describes a power loss. The zero value drops every unsynced byte and
// every entry change that was not made durable, and nothing else.
type Loss struct {
	// Seed drives every random choice (with the file's path): the same seed
	// over the same writes gives the same directory.
	Seed uint64
	// Writeback keeps, of each file, a random prefix of its unsynced bytes.
	Writeback bool
	// Tear, unless NoTear, damages each file that lost unsynced bytes: a
	// region of random length that starts where what it kept ends and ends
	// no later than the end of that sector or than the file as written.
	Tear Tear
	// KeepNewDirs keeps the directories MkdirAll created even when their
	// parent was never synced afterwards (what journaling file systems
	// such as ext4 and XFS do in practice, as they commit a mkdir with the
	// next fsync; POSIX does not promise it).
	KeepNewDirs bool
}

func (l Loss) String() string {
	return fmt.Sprintf("seed=%d writeback=%v tear=%v keep_new_dirs=%v", l.Seed, l.Writeback, l.Tear, l.KeepNewDirs)
}

// Entry is what a loss did to a directory entry.
type Entry string

const (
	// EntryKept: the entry names the same file as before the loss.
	EntryKept Entry = ""
	// EntryVanished: the entry was created (or a file renamed to it) and
	// that was never made durable: it is gone.
	EntryVanished Entry = "vanished"
	// EntryReappeared: the entry was removed (or its file renamed away) and
	// that was never made durable: it is back.
	EntryReappeared Entry = "reappeared"
	// EntryReplaced: the entry names another file than before the loss
	// (a rename over it was never made durable).
	EntryReplaced Entry = "replaced"
)

// FileLoss is what a loss did to one path.
type FileLoss struct {
	// Path is relative to the root, slash-separated; a directory's ends in
	// a slash.
	Path string
	// Entry is what became of the directory entry.
	Entry Entry
	// Written is the file's length before the loss (0 if the entry did not
	// exist then).
	Written int64
	// Synced is the length its last Sync made durable.
	Synced int64
	// Length is its length after the loss (0 if the entry is gone).
	Length int64
	// Unsynced is what was written since the last Sync, counted from the
	// lowest offset changed since.
	Unsynced int64
	// Kept is how much of Unsynced survived (Loss.Writeback).
	Kept int64
	// Dropped is Unsynced - Kept, or the whole file for an entry that
	// vanished.
	Dropped int64
	// Torn is the length of the torn region (Loss.Tear).
	Torn int64
}

// Report is what a power loss did, by path (sorted).
type Report struct {
	Loss  Loss
	Files []FileLoss
}

// Dropped is the total of Dropped over every file.
func (r *Report) Dropped() int64 {
	var n int64
	for _, f := range r.Files {
		n += f.Dropped
	}
	return n
}

// File returns the entry of path (relative to the root, slash-separated).
func (r *Report) File(path string) (FileLoss, bool) {
	for _, f := range r.Files {
		if f.Path == path {
			return f, true
		}
	}
	return FileLoss{}, false
}

func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "power loss (%v): %d paths changed, %d bytes dropped", r.Loss, len(r.Files), r.Dropped())
	for _, f := range r.Files {
		fmt.Fprintf(&b, "\n  %s", f.Path)
		if f.Entry != EntryKept {
			fmt.Fprintf(&b, " [%s]", f.Entry)
		}
		fmt.Fprintf(&b, ": written %d, synced %d, now %d (unsynced %d: kept %d, dropped %d; torn %d)",
			f.Written, f.Synced, f.Length, f.Unsynced, f.Kept, f.Dropped, f.Torn)
	}
	return b.String()
}

// PowerLoss stops the world (every later call on f and on its files fails
// with ErrPowerLost) and rewrites the root to what survived the loss. It
// can be called once; the next process opens a new FS over the root.
func (f *FS) PowerLoss(loss Loss) (*Report, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost {
		return nil, ErrPowerLost
	}
	f.lost = true
	for h := range f.open {
		_ = h.f.Close()
		h.f = nil
	}
	clear(f.open)
	r := &restorer{loss: loss, report: &Report{Loss: loss}, done: map[*node][]byte{}}
	if err := r.dir(f.top, f.root, ""); err != nil {
		return r.report, fmt.Errorf("powerloss: rewrite %s: %w", f.root, err)
	}
	return r.report, nil
}

type restorer struct {
	loss   Loss
	report *Report
	// done is the content each file survived with (a file may have two
	// durable names, after a rename across directories).
	done map[*node][]byte
}

// dir sets the known entries of directory d (at real path p, rel below the
// root) to their durable state.
func (r *restorer) dir(d *node, p, rel string) error {
	names := make([]string, 0, len(d.known))
	for name := range d.known {
		if d.entries[name] != nil || d.durable[name] != nil {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		have, want := d.entries[name], d.durable[name]
		if want == nil && have != nil && have.dir && r.loss.KeepNewDirs {
			want = have
		}
		if err := r.entry(filepath.Join(p, name), path.Join(rel, name), have, want); err != nil {
			return err
		}
	}
	return nil
}

// entry sets one entry from have (now) to want (durable).
func (r *restorer) entry(p, rel string, have, want *node) error {
	if have != want && have != nil {
		if err := os.RemoveAll(p); err != nil {
			return err
		}
	}
	if want == nil {
		fl := FileLoss{Path: rel, Entry: EntryVanished}
		if have.dir {
			fl.Path += "/"
		} else {
			fl.Written = int64(len(have.cur))
			fl.Dropped = fl.Written
		}
		r.report.Files = append(r.report.Files, fl)
		return nil
	}
	if want.dir {
		if have != want {
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			r.report.Files = append(r.report.Files, FileLoss{Path: rel + "/", Entry: EntryReappeared})
		}
		return r.dir(want, p, rel)
	}
	fl := FileLoss{Path: rel, Synced: int64(len(want.synced))}
	switch {
	case have == nil:
		fl.Entry = EntryReappeared
	case have != want:
		fl.Entry = EntryReplaced
	}
	if have != nil && !have.dir {
		fl.Written = int64(len(have.cur))
	}
	data, seen := r.done[want]
	if !seen {
		data = r.survive(want, rel, &fl)
		r.done[want] = data
	}
	fl.Length = int64(len(data))
	if have == want && bytes.Equal(data, want.cur) {
		if fl.Unsynced != 0 {
			r.report.Files = append(r.report.Files, fl)
		}
		return nil
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		return err
	}
	r.report.Files = append(r.report.Files, fl)
	return nil
}

// survive computes what file n holds after the loss, and records it in fl.
func (r *restorer) survive(n *node, rel string, fl *FileLoss) []byte {
	cur, synced, dirty := n.cur, n.synced, n.dirty
	if dirty == len(cur) && dirty == len(synced) {
		return slices.Clone(synced)
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(rel))
	rng := rand.New(rand.NewPCG(r.loss.Seed, h.Sum64()))

	// The first keep bytes are as last written, the rest as last synced.
	keep := dirty
	if r.loss.Writeback {
		// Writeback ends somewhere in the bytes that differ from the disk's:
		// rewriting a file's tail with what it already held (a journal's
		// zeros written ahead of its frames) changes nothing to cut short.
		end := len(cur)
		if end == len(synced) {
			for end > dirty && cur[end-1] == synced[end-1] {
				end--
			}
		}
		keep += rng.IntN(end - dirty + 1)
		if keep < len(synced) {
			// An overwrite in place (of a journal's zeros written ahead
			// of its frames) reaches the disk in whole sectors.
			keep = max(dirty, keep/OverwriteSector*OverwriteSector)
		}
	}
	out := slices.Clone(cur[:keep])
	if keep < len(synced) {
		out = append(out, synced[keep:]...)
	}
	fl.Unsynced = int64(len(cur) - dirty)
	fl.Kept = int64(keep - dirty)
	fl.Dropped = fl.Unsynced - fl.Kept
	if r.loss.Tear != NoTear && keep < len(cur) {
		end := min((keep/SectorSize+1)*SectorSize, len(cur))
		end = keep + 1 + rng.IntN(end-keep)
		if len(out) < end {
			out = append(out, make([]byte, end-len(out))...)
		}
		torn := out[keep:end]
		if r.loss.Tear == TearGarbage {
			for i := range torn {
				torn[i] = byte(rng.Uint32())
			}
		} else {
			clear(torn)
		}
		fl.Torn = int64(len(torn))
	}
	return out
}
