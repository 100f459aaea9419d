package powerloss_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/ursula/ursula/storage/wal"
	"github.com/ursula/ursula/storage/wal/powerloss"
)

// absent marks a file that must not exist after the loss.
const absent = "<absent>"

func create(tb testing.TB, fsys wal.FS, name string) wal.File {
	tb.Helper()
	f, err := fsys.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

func open(tb testing.TB, fsys wal.FS, name string, flag int) wal.File {
	tb.Helper()
	f, err := fsys.OpenFile(name, flag, 0)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

func write(tb testing.TB, f wal.File, s string) {
	tb.Helper()
	if _, err := f.Write([]byte(s)); err != nil {
		tb.Fatal(err)
	}
}

func fsync(tb testing.TB, f wal.File) {
	tb.Helper()
	if err := f.Sync(); err != nil {
		tb.Fatal(err)
	}
}

func closeFile(tb testing.TB, f wal.File) {
	tb.Helper()
	if err := f.Close(); err != nil {
		tb.Fatal(err)
	}
}

func syncDir(tb testing.TB, fsys wal.FS, dir string) {
	tb.Helper()
	if err := wal.SyncDir(fsys, dir); err != nil {
		tb.Fatal(err)
	}
}

// durableFile creates name with content s, synced, its entry synced.
func durableFile(tb testing.TB, fsys wal.FS, name, s string) {
	tb.Helper()
	f := create(tb, fsys, name)
	write(tb, f, s)
	fsync(tb, f)
	closeFile(tb, f)
	syncDir(tb, fsys, filepath.Dir(name))
}

func mustLose(tb testing.TB, fsys *powerloss.FS, loss powerloss.Loss) *powerloss.Report {
	tb.Helper()
	r, err := fsys.PowerLoss(loss)
	if err != nil {
		tb.Fatalf("PowerLoss: %v", err)
	}
	tb.Log(r)
	return r
}

func checkFiles(tb testing.TB, root string, want map[string]string) {
	tb.Helper()
	for name, w := range want {
		got, err := os.ReadFile(filepath.Join(root, name))
		switch {
		case w == absent && errors.Is(err, fs.ErrNotExist):
		case w == absent:
			tb.Errorf("%s: %q, %v; want it gone", name, got, err)
		case err != nil:
			tb.Errorf("%s: %v; want %q", name, err, w)
		case string(got) != w:
			tb.Errorf("%s: %q, want %q", name, got, w)
		}
	}
}

func TestPowerLoss(t *testing.T) {
	tests := []struct {
		name string
		// setup runs on a first FS whose writes are all durable (an
		// earlier boot, before the FS under test looks at the root).
		setup func(tb testing.TB, fsys wal.FS, root string)
		run   func(tb testing.TB, fsys wal.FS, root string)
		loss  powerloss.Loss
		want  map[string]string
		// dropped is the report's total of dropped bytes.
		dropped int64
	}{
		{
			name: "write, sync, write keeps the synced prefix",
			run: func(tb testing.TB, fsys wal.FS, root string) {
				f := create(tb, fsys, filepath.Join(root, "a"))
				write(tb, f, "synced;")
				fsync(tb, f)
				syncDir(tb, fsys, root)
				write(tb, f, "lost")
			},
			want:    map[string]string{"a": "synced;"},
			dropped: 4,
		},
		{
			name: "a created file whose directory was not synced disappears",
			run: func(tb testing.TB, fsys wal.FS, root string) {
				f := create(tb, fsys, filepath.Join(root, "a"))
				write(tb, f, "data")
				fsync(tb, f)
				closeFile(tb, f)
			},
			want:    map[string]string{"a": absent},
			dropped: 4,
		},
		{
			name: "a created file survives once its directory was synced",
			run: func(tb testing.TB, fsys wal.FS, root string) {
				durableFile(tb, fsys, filepath.Join(root, "a"), "data")
			},
			want: map[string]string{"a": "data"},
		},
		{
			name: "an entry synced before its data survives empty",
			run: func(tb testing.TB, fsys wal.FS, root string) {
				f := create(tb, fsys, filepath.Join(root, "a"))
				syncDir(tb, fsys, root)
				write(tb, f, "data")
			},
			want:    map[string]string{"a": ""},
			dropped: 4,
		},
		{
			name: "a rename without a directory sync is undone",
			setup: func(tb testing.TB, fsys wal.FS, root string) {
				durableFile(tb, fsys, filepath.Join(root, "a"), "A")
				durableFile(tb, fsys, filepath.Join(root, "b"), "B")
			},
			run: func(tb testing.TB, fsys wal.FS, root string) {
				if err := fsys.Rename(filepath.Join(root, "a"), filepath.Join(root, "b")); err != nil {
					tb.Fatal(err)
				}
			},
			want: map[string]string{"a": "A", "b": "B"},
		},
		{
			name: "a rename with a directory sync is durable",
			setup: func(tb testing.TB, fsys wal.FS, root string) {
				durableFile(tb, fsys, filepath.Join(root, "a"), "A")
				durableFile(tb, fsys, filepath.Join(root, "b"), "B")
			},
			run: func(tb testing.TB, fsys wal.FS, root string) {
				if err := fsys.Rename(filepath.Join(root, "a"), filepath.Join(root, "b")); err != nil {
					tb.Fatal(err)
				}
				syncDir(tb, fsys, root)
			},
			want: map[string]string{"a": absent, "b": "A"},
		},
		{
			name: "WriteFileAtomic is durable; its unsynced predecessor is not",
			run: func(tb testing.TB, fsys wal.FS, root string) {
				if err := wal.WriteFileAtomic(fsys, root, filepath.Join(root, "x"), []byte("atomic")); err != nil {
					tb.Fatal(err)
				}
				f := open(tb, fsys, filepath.Join(root, "x.tmp"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC)
				write(tb, f, "next")
				if err := fsys.Rename(filepath.Join(root, "x.tmp"), filepath.Join(root, "x")); err != nil {
					tb.Fatal(err)
				}
			},
			want: map[string]string{"x": "atomic", "x.tmp": absent},
		},
		{
			name: "an unsynced removal is undone with the synced content",
			setup: func(tb testing.TB, fsys wal.FS, root string) {
				durableFile(tb, fsys, filepath.Join(root, "a"), "A")
			},
			run: func(tb testing.TB, fsys wal.FS, root string) {
				f := open(tb, fsys, filepath.Join(root, "a"), os.O_WRONLY|os.O_APPEND)
				write(tb, f, "+unsynced")
				closeFile(tb, f)
				if err := fsys.Remove(filepath.Join(root, "a")); err != nil {
					tb.Fatal(err)
				}
			},
			want:    map[string]string{"a": "A"},
			dropped: int64(len("+unsynced")),
		},
		{
			name: "a synced removal is durable",
			setup: func(tb testing.TB, fsys wal.FS, root string) {
				durableFile(tb, fsys, filepath.Join(root, "a"), "A")
			},
			run: func(tb testing.TB, fsys wal.FS, root string) {
				if err := fsys.Remove(filepath.Join(root, "a")); err != nil {
					tb.Fatal(err)
				}
				syncDir(tb, fsys, root)
			},
			want: map[string]string{"a": absent},
		},
		{
			name: "an unsynced truncate is undone",
			setup: func(tb testing.TB, fsys wal.FS, root string) {
				durableFile(tb, fsys, filepath.Join(root, "a"), "hello world")
			},
			run: func(tb testing.TB, fsys wal.FS, root string) {
				f := open(tb, fsys, filepath.Join(root, "a"), os.O_WRONLY)
				if err := f.Truncate(5); err != nil {
					tb.Fatal(err)
				}
			},
			want: map[string]string{"a": "hello world"},
		},
		{
			name: "truncate then sync is durable; the write after it is not",
			setup: func(tb testing.TB, fsys wal.FS, root string) {
				durableFile(tb, fsys, filepath.Join(root, "a"), "hello world")
			},
			run: func(tb testing.TB, fsys wal.FS, root string) {
				f := open(tb, fsys, filepath.Join(root, "a"), os.O_WRONLY|os.O_APPEND)
				if err := f.Truncate(5); err != nil {
					tb.Fatal(err)
				}
				fsync(tb, f)
				write(tb, f, "!!")
			},
			want:    map[string]string{"a": "hello"},
			dropped: 2,
		},
		{
			name: "an unsynced overwrite after a truncate leaves the synced bytes",
			setup: func(tb testing.TB, fsys wal.FS, root string) {
				durableFile(tb, fsys, filepath.Join(root, "a"), "abcdef")
			},
			run: func(tb testing.TB, fsys wal.FS, root string) {
				f := open(tb, fsys, filepath.Join(root, "a"), os.O_WRONLY|os.O_APPEND)
				if err := f.Truncate(2); err != nil {
					tb.Fatal(err)
				}
				write(tb, f, "ZZ")
			},
			want:    map[string]string{"a": "abcdef"},
			dropped: 2,
		},
		{
			name: "O_TRUNC is unsynced until a Sync",
			setup: func(tb testing.TB, fsys wal.FS, root string) {
				durableFile(tb, fsys, filepath.Join(root, "a"), "old content")
				durableFile(tb, fsys, filepath.Join(root, "b"), "old content")
			},
			run: func(tb testing.TB, fsys wal.FS, root string) {
				f := open(tb, fsys, filepath.Join(root, "a"), os.O_WRONLY|os.O_TRUNC)
				write(tb, f, "new")
				g := open(tb, fsys, filepath.Join(root, "b"), os.O_WRONLY|os.O_TRUNC)
				write(tb, g, "new")
				fsync(tb, g)
			},
			want:    map[string]string{"a": "old content", "b": "new"},
			dropped: 3,
		},
		{
			name: "a new directory whose parent was not synced disappears",
			run: func(tb testing.TB, fsys wal.FS, root string) {
				if err := fsys.MkdirAll(filepath.Join(root, "d", "e"), 0o755); err != nil {
					tb.Fatal(err)
				}
				durableFile(tb, fsys, filepath.Join(root, "d", "e", "f"), "F")
				syncDir(tb, fsys, filepath.Join(root, "d"))
			},
			want:    map[string]string{"d": absent},
			dropped: 0,
		},
		{
			name: "KeepNewDirs keeps it",
			run: func(tb testing.TB, fsys wal.FS, root string) {
				if err := fsys.MkdirAll(filepath.Join(root, "d", "e"), 0o755); err != nil {
					tb.Fatal(err)
				}
				durableFile(tb, fsys, filepath.Join(root, "d", "e", "f"), "F")
				f := create(tb, fsys, filepath.Join(root, "d", "e", "g"))
				fsync(tb, f)
			},
			loss:    powerloss.Loss{KeepNewDirs: true},
			want:    map[string]string{"d/e/f": "F", "d/e/g": absent},
			dropped: 0,
		},
		{
			name: "files the FS never touched are left alone",
			setup: func(tb testing.TB, fsys wal.FS, root string) {
				durableFile(tb, fsys, filepath.Join(root, "untouched"), "U")
				durableFile(tb, fsys, filepath.Join(root, "touched"), "T")
			},
			run: func(tb testing.TB, fsys wal.FS, root string) {
				f := open(tb, fsys, filepath.Join(root, "touched"), os.O_WRONLY|os.O_APPEND)
				write(tb, f, "+more")
			},
			want:    map[string]string{"untouched": "U", "touched": "T"},
			dropped: 5,
		},
		{
			name: "zeros tear the sector after the synced length",
			run: func(tb testing.TB, fsys wal.FS, root string) {
				f := create(tb, fsys, filepath.Join(root, "a"))
				syncDir(tb, fsys, root)
				write(tb, f, "0123456789")
				fsync(tb, f)
				write(tb, f, strings.Repeat("x", 3*powerloss.SectorSize))
			},
			loss:    powerloss.Loss{Seed: 1, Tear: powerloss.TearZeros},
			dropped: 3 * powerloss.SectorSize,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if tt.setup != nil {
				tt.setup(t, wal.OSFS{}, root)
			}
			fsys := powerloss.New(root)
			tt.run(t, fsys, root)
			r := mustLose(t, fsys, tt.loss)
			checkFiles(t, root, tt.want)
			if got := r.Dropped(); got != tt.dropped {
				t.Errorf("report drops %d bytes, want %d", got, tt.dropped)
			}
		})
	}
}

func TestTornSector(t *testing.T) {
	for _, tear := range []powerloss.Tear{powerloss.TearZeros, powerloss.TearGarbage} {
		t.Run(tear.String(), func(t *testing.T) {
			for seed := range uint64(20) {
				root := t.TempDir()
				fsys := powerloss.New(root)
				f := create(t, fsys, filepath.Join(root, "a"))
				syncDir(t, fsys, root)
				synced := bytes.Repeat([]byte("s"), 100)
				write(t, f, string(synced))
				fsync(t, f)
				written := bytes.Repeat([]byte("u"), 3*powerloss.SectorSize)
				write(t, f, string(written))
				r, err := fsys.PowerLoss(powerloss.Loss{Seed: seed, Writeback: seed%2 == 1, Tear: tear})
				if err != nil {
					t.Fatal(err)
				}
				fl, _ := r.File("a")
				got, err := os.ReadFile(filepath.Join(root, "a"))
				if err != nil {
					t.Fatal(err)
				}
				keep := len(synced) + int(fl.Kept)
				switch {
				case !bytes.Equal(got[:keep], append(synced, written...)[:keep]):
					t.Fatalf("seed %d: the kept prefix differs: %v", seed, r)
				case fl.Kept < int64(len(written)) && fl.Torn == 0:
					t.Fatalf("seed %d: not torn: %v", seed, r)
				case int64(len(got)) != int64(keep)+fl.Torn:
					t.Fatalf("seed %d: %d bytes, want kept %d + torn %d", seed, len(got), keep, fl.Torn)
				case (keep+int(fl.Torn)-1)/powerloss.SectorSize != keep/powerloss.SectorSize:
					t.Fatalf("seed %d: the tear [%d, %d) crosses a sector boundary", seed, keep, keep+int(fl.Torn))
				case tear == powerloss.TearZeros && bytes.Count(got[keep:], []byte{0}) != len(got)-keep:
					t.Fatalf("seed %d: the torn region is not zeros", seed)
				}
			}
		})
	}
}

// lossWorkload writes a few files with synced and unsynced bytes and loses
// power with loss; it returns every file's bytes after the loss.
func lossWorkload(tb testing.TB, loss powerloss.Loss) map[string][]byte {
	tb.Helper()
	root := tb.TempDir()
	fsys := powerloss.New(root)
	for i := range 8 {
		f := create(tb, fsys, filepath.Join(root, fmt.Sprintf("f%d", i)))
		for j := range 50 {
			write(tb, f, fmt.Sprintf("file %d record %03d;", i, j))
			if j == 10*(i%4) {
				fsync(tb, f)
			}
		}
	}
	syncDir(tb, fsys, root)
	mustLose(tb, fsys, loss)
	out := map[string][]byte{}
	for i := range 8 {
		name := fmt.Sprintf("f%d", i)
		b, err := os.ReadFile(filepath.Join(root, name))
		if err != nil {
			tb.Fatal(err)
		}
		out[name] = b
	}
	return out
}

func TestSeedReplays(t *testing.T) {
	for _, tear := range []powerloss.Tear{powerloss.NoTear, powerloss.TearZeros, powerloss.TearGarbage} {
		t.Run(tear.String(), func(t *testing.T) {
			loss := powerloss.Loss{Seed: 42, Writeback: true, Tear: tear}
			first, again := lossWorkload(t, loss), lossWorkload(t, loss)
			for name, b := range first {
				if !bytes.Equal(b, again[name]) {
					t.Errorf("%s differs between two losses with seed %d", name, loss.Seed)
				}
			}
			loss.Seed = 43
			other := lossWorkload(t, loss)
			same := 0
			for name, b := range first {
				if bytes.Equal(b, other[name]) {
					same++
				}
			}
			if same == len(first) {
				t.Errorf("seeds 42 and 43 left the same files")
			}
		})
	}
}

func TestDeadAfterLoss(t *testing.T) {
	root := t.TempDir()
	fsys := powerloss.New(root)
	f := create(t, fsys, filepath.Join(root, "a"))
	d := open(t, fsys, root, os.O_RDONLY)
	mustLose(t, fsys, powerloss.Loss{})

	checks := []struct {
		name string
		err  error
	}{
		{"write", func() error { _, err := f.Write([]byte("x")); return err }()},
		{"sync", f.Sync()},
		{"truncate", f.Truncate(0)},
		{"close", f.Close()},
		{"directory sync", d.Sync()},
		{"open", func() error {
			_, err := fsys.OpenFile(filepath.Join(root, "b"), os.O_CREATE|os.O_WRONLY, 0o644)
			return err
		}()},
		{"rename", fsys.Rename(filepath.Join(root, "a"), filepath.Join(root, "b"))},
		{"remove", fsys.Remove(filepath.Join(root, "a"))},
		{"mkdir", fsys.MkdirAll(filepath.Join(root, "d"), 0o755)},
		{"readdir", func() error { _, err := fsys.ReadDir(root); return err }()},
		{"second loss", func() error { _, err := fsys.PowerLoss(powerloss.Loss{}); return err }()},
	}
	for _, c := range checks {
		if !errors.Is(c.err, powerloss.ErrPowerLost) {
			t.Errorf("%s after the loss: %v, want ErrPowerLost", c.name, c.err)
		}
	}
	// The next boot sees what survived and works on it.
	next := powerloss.New(root)
	des, err := next.ReadDir(root)
	if err != nil || len(des) != 0 {
		t.Fatalf("after the loss: %v, %v; want an empty root", des, err)
	}
	durableFile(t, next, filepath.Join(root, "a"), "A")
	checkFiles(t, root, map[string]string{"a": "A"})
}

func TestOutsideTheRootIsRefused(t *testing.T) {
	root := t.TempDir()
	fsys := powerloss.New(filepath.Join(root, "in"))
	if _, err := fsys.OpenFile(filepath.Join(root, "out"), os.O_CREATE|os.O_WRONLY, 0o644); !errors.Is(err, powerloss.ErrNotModelled) {
		t.Fatalf("open outside the root: %v, want ErrNotModelled", err)
	}
}

// TestConcurrentWriters writes from several goroutines, as the shard
// workers of a node do; run it with -race. Every synced record survives.
func TestConcurrentWriters(t *testing.T) {
	root := t.TempDir()
	fsys := powerloss.New(root)
	const writers, records = 4, 200
	var wg sync.WaitGroup
	synced := make([]int, writers)
	for w := range writers {
		dir := filepath.Join(root, fmt.Sprintf("shard-%d", w))
		if err := fsys.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			f, err := fsys.OpenFile(filepath.Join(dir, "log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
			if err != nil {
				t.Error(err)
				return
			}
			if err := wal.SyncDir(fsys, dir); err != nil {
				t.Error(err)
				return
			}
			for i := range records {
				if _, err := f.Write(fmt.Appendf(nil, "%04d;", i)); err != nil {
					t.Error(err)
					return
				}
				if i%7 == 0 {
					if err := f.Sync(); err != nil {
						t.Error(err)
						return
					}
					synced[w] = i + 1
				}
				if _, err := fsys.ReadDir(dir); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	mustLose(t, fsys, powerloss.Loss{Seed: 7, Writeback: true, KeepNewDirs: true})
	for w := range writers {
		got, err := os.ReadFile(filepath.Join(root, fmt.Sprintf("shard-%d", w), "log"))
		if err != nil {
			t.Fatal(err)
		}
		var want strings.Builder
		for i := range records {
			fmt.Fprintf(&want, "%04d;", i)
		}
		if len(got) < 5*synced[w] || !strings.HasPrefix(want.String(), string(got)) {
			t.Errorf("writer %d: %q is not a prefix of what it wrote at least %d records long", w, got, synced[w])
		}
	}
}
