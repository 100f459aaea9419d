package objstoretest

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ursula/ursula/storage/objstore"
)

// LargeObjectSize is the size of the contract's large object: above a
// 5 MiB multipart threshold with 5 MiB parts, it goes up in three parts.
const LargeObjectSize = 12 << 20

// PartBoundary is where the large object's first part ends with 5 MiB
// parts; the contract reads a range across it.
const PartBoundary = 5 << 20

// Contract runs the behaviour every objstore.Store must have, each case in
// a subtest on a store of its own from newStore (which must be empty). Run
// S3 stores with a small multipart threshold (5 MiB threshold and parts) so
// the large-object case exercises multipart uploads.
func Contract(t *testing.T, newStore func(t *testing.T) objstore.Store) {
	cases := []struct {
		name string
		run  func(t *testing.T, s objstore.Store)
	}{
		{"RoundTrip", testRoundTrip},
		{"Overwrite", testOverwrite},
		{"Missing", testMissing},
		{"GetRange", testGetRange},
		{"PutIfAbsent", testPutIfAbsent},
		{"PutIfAbsentRace", testPutIfAbsentRace},
		{"List", testList},
		{"ListStops", testListStops},
		{"Delete", testDelete},
		{"Head", testHead},
		{"SpecialKeys", testSpecialKeys},
		{"InvalidKeys", testInvalidKeys},
		{"ConcurrentPutDelete", testConcurrentPutDelete},
		{"LargeObject", testLargeObject},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, newStore(t)) })
	}
}

func testRoundTrip(t *testing.T, s objstore.Store) {
	binary := make([]byte, 256*4)
	for i := range binary {
		binary[i] = byte(i)
	}
	for _, tc := range []struct {
		name, key string
		body      []byte
	}{
		{"empty", "empty", []byte{}},
		{"nil", "nil", nil},
		{"text", "dir/text", []byte("hello, object")},
		{"binary", "dir/sub/binary", binary},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := bytes.Clone(tc.body)
			mustPut(t, s, tc.key, body)
			if len(body) > 0 {
				body[0] ^= 0xff // the store must have copied it
			}
			got := mustGet(t, s, tc.key)
			if !bytes.Equal(got, tc.body) {
				t.Fatalf("Get(%q) = %d bytes, want the %d put", tc.key, len(got), len(tc.body))
			}
			if len(got) > 0 {
				got[0] ^= 0xff // nor may it hand out its own copy
				if again := mustGet(t, s, tc.key); !bytes.Equal(again, tc.body) {
					t.Fatalf("Get(%q) after changing a returned body: changed", tc.key)
				}
			}
		})
	}
}

func testOverwrite(t *testing.T, s objstore.Store) {
	mustPut(t, s, "k", []byte("first version, longer"))
	mustPut(t, s, "k", []byte("second"))
	if got := mustGet(t, s, "k"); string(got) != "second" {
		t.Fatalf("Get after overwrite = %q, want %q", got, "second")
	}
	if info := mustHead(t, s, "k"); info.Size != int64(len("second")) {
		t.Fatalf("Head after overwrite: size %d, want %d", info.Size, len("second"))
	}
}

func testMissing(t *testing.T, s objstore.Store) {
	ctx := t.Context()
	mustPut(t, s, "present/a", []byte("x"))
	for _, key := range []string{"missing", "present/missing", "present", "present/a/below"} {
		_, err := s.Get(ctx, key)
		checkNotFound(t, "get", key, err)
		_, err = s.GetRange(ctx, key, 0, 1)
		checkNotFound(t, "get-range", key, err)
		_, err = s.Head(ctx, key)
		checkNotFound(t, "head", key, err)
	}
}

func checkNotFound(t *testing.T, op, key string, err error) {
	t.Helper()
	if !errors.Is(err, objstore.ErrNotFound) {
		t.Errorf("%s %q: err = %v, want ErrNotFound", op, key, err)
		return
	}
	checkNames(t, op, key, err)
	if errors.Is(err, objstore.ErrInvalidRange) || errors.Is(err, objstore.ErrInvalidKey) {
		t.Errorf("%s %q: err = %v is more than not found", op, key, err)
	}
}

// checkNames checks that an error names the operation and the key.
func checkNames(t *testing.T, op, key string, err error) {
	t.Helper()
	if msg := err.Error(); !strings.Contains(msg, op) || !strings.Contains(msg, strconv.Quote(key)) {
		t.Errorf("error %q does not name the operation %s and the key %q", msg, op, key)
	}
}

func testGetRange(t *testing.T, s objstore.Store) {
	ctx := t.Context()
	body := []byte("0123456789abcdefghij") // 20 bytes
	mustPut(t, s, "r", body)
	mustPut(t, s, "empty", nil)
	for _, tc := range []struct {
		name   string
		off, n int64
		want   string
	}{
		{"start", 0, 4, "0123"},
		{"inside", 5, 5, "56789"},
		{"whole", 0, 20, string(body)},
		{"to the end", 15, 5, "fghij"},
		{"short at the end", 15, 100, "fghij"},
		{"last byte", 19, 1, "j"},
		{"huge length", 10, 1<<63 - 1, "abcdefghij"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.GetRange(ctx, "r", tc.off, tc.n)
			if err != nil {
				t.Fatalf("GetRange(%d, %d): %v", tc.off, tc.n, err)
			}
			if string(got) != tc.want {
				t.Fatalf("GetRange(%d, %d) = %q, want %q", tc.off, tc.n, got, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name   string
		key    string
		off, n int64
	}{
		{"at the end", "r", 20, 1},
		{"past the end", "r", 21, 5},
		{"far past the end", "r", 1 << 40, 5},
		{"empty object", "empty", 0, 1},
		{"negative offset", "r", -1, 5},
		{"zero length", "r", 0, 0},
		{"negative length", "r", 0, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.GetRange(ctx, tc.key, tc.off, tc.n)
			if !errors.Is(err, objstore.ErrInvalidRange) {
				t.Fatalf("GetRange(%q, %d, %d): err = %v, want ErrInvalidRange", tc.key, tc.off, tc.n, err)
			}
			if errors.Is(err, objstore.ErrNotFound) {
				t.Fatalf("GetRange(%q, %d, %d): err = %v also says not found", tc.key, tc.off, tc.n, err)
			}
			checkNames(t, "get-range", tc.key, err)
		})
	}
}

func testPutIfAbsent(t *testing.T, s objstore.Store) {
	ctx := t.Context()
	created, err := s.PutIfAbsent(ctx, "once/k", []byte("first"))
	if err != nil || !created {
		t.Fatalf("PutIfAbsent of a new key = %v, %v; want true, nil", created, err)
	}
	created, err = s.PutIfAbsent(ctx, "once/k", []byte("second"))
	if err != nil || created {
		t.Fatalf("PutIfAbsent of an existing key = %v, %v; want false, nil", created, err)
	}
	if got := mustGet(t, s, "once/k"); string(got) != "first" {
		t.Fatalf("after a refused PutIfAbsent, Get = %q, want %q", got, "first")
	}
	// After a delete the key is free again.
	mustDelete(t, s, "once/k")
	created, err = s.PutIfAbsent(ctx, "once/k", []byte("third"))
	if err != nil || !created {
		t.Fatalf("PutIfAbsent after Delete = %v, %v; want true, nil", created, err)
	}
	if got := mustGet(t, s, "once/k"); string(got) != "third" {
		t.Fatalf("Get = %q, want %q", got, "third")
	}
}

func testPutIfAbsentRace(t *testing.T, s objstore.Store) {
	const writers = 16
	ctx := t.Context()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		winners []int
		errs    []error
	)
	start := make(chan struct{})
	for i := range writers {
		wg.Go(func() {
			<-start
			created, err := s.PutIfAbsent(ctx, "race/k", fmt.Appendf(nil, "writer %d", i))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
			}
			if created {
				winners = append(winners, i)
			}
		})
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("concurrent PutIfAbsent: %v", errors.Join(errs...))
	}
	if len(winners) != 1 {
		t.Fatalf("%d concurrent PutIfAbsent: winners %v, want exactly one", writers, winners)
	}
	if got, want := string(mustGet(t, s, "race/k")), fmt.Sprintf("writer %d", winners[0]); got != want {
		t.Fatalf("Get = %q, want the winner's %q", got, want)
	}
}

func testList(t *testing.T, s objstore.Store) {
	// Includes keys whose order differs from a directory walk's: "a-c"
	// sorts before "a/..." ('-' < '/'), "a0" after; "a/b!" before
	// "a/b/...". No key is the directory of another ("a/b" and "a/b/c"):
	// that is not portable (see the package documentation).
	keys := []string{
		"a/b/c", "a/b/d/e", "a/bc", "a/c", "a-c", "a0", "b", "ab/x", "a/b!",
	}
	for i, key := range keys {
		mustPut(t, s, key, bytes.Repeat([]byte{'x'}, i))
	}
	size := func(key string) int64 { return int64(slices.Index(keys, key)) }
	for _, tc := range []struct {
		name, prefix string
		want         []string
	}{
		{"all", "", []string{"a-c", "a/b!", "a/b/c", "a/b/d/e", "a/bc", "a/c", "a0", "ab/x", "b"}},
		{"directory", "a/", []string{"a/b!", "a/b/c", "a/b/d/e", "a/bc", "a/c"}},
		{"not on a boundary", "a/b", []string{"a/b!", "a/b/c", "a/b/d/e", "a/bc"}},
		{"nested directory", "a/b/", []string{"a/b/c", "a/b/d/e"}},
		{"partial top segment", "a", []string{"a-c", "a/b!", "a/b/c", "a/b/d/e", "a/bc", "a/c", "a0", "ab/x"}},
		{"exact key", "a/c", []string{"a/c"}},
		{"deep", "a/b/d/e", []string{"a/b/d/e"}},
		{"no match", "zzz", nil},
		{"no match below a key", "b/", nil},
		{"no match in a directory", "a/x", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			err := s.List(t.Context(), tc.prefix, func(info objstore.Info) error {
				got = append(got, info.Key)
				if info.Size != size(info.Key) {
					t.Errorf("List: %q has size %d, want %d", info.Key, info.Size, size(info.Key))
				}
				if info.Modified.IsZero() {
					t.Errorf("List: %q has no modification time", info.Key)
				}
				return nil
			})
			if err != nil {
				t.Fatalf("List(%q): %v", tc.prefix, err)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("List(%q) = %q, want %q", tc.prefix, got, tc.want)
			}
		})
	}
}

func testListStops(t *testing.T, s objstore.Store) {
	for _, key := range []string{"l/1", "l/2", "l/3", "l/4/5"} {
		mustPut(t, s, key, []byte(key))
	}
	stop := errors.New("enough")
	var got []string
	err := s.List(t.Context(), "l/", func(info objstore.Info) error {
		got = append(got, info.Key)
		if len(got) == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("List with fn failing: err = %v, want fn's error", err)
	}
	if !slices.Equal(got, []string{"l/1", "l/2"}) {
		t.Fatalf("List called fn for %q after it failed; want [l/1 l/2]", got)
	}
	// An empty listing calls nothing.
	err = s.List(t.Context(), "nothing/", func(objstore.Info) error { return stop })
	if err != nil {
		t.Fatalf("List of an empty prefix: %v", err)
	}
}

func testDelete(t *testing.T, s objstore.Store) {
	ctx := t.Context()
	for _, key := range []string{"d/1", "d/2", "d/sub/3", "d/sub/deeper/4", "keep"} {
		mustPut(t, s, key, []byte(key))
	}
	mustDelete(t, s, "d/1", "missing", "d/sub/3", "d/sub/deeper/4", "d/sub/missing/5", "d/2/below")
	for _, key := range []string{"d/1", "d/sub/3", "d/sub/deeper/4"} {
		_, err := s.Get(ctx, key)
		checkNotFound(t, "get", key, err)
	}
	if got := listKeys(t, s, ""); !slices.Equal(got, []string{"d/2", "keep"}) {
		t.Fatalf("after Delete, List = %q, want [d/2 keep]", got)
	}
	mustDelete(t, s) // no keys
	mustDelete(t, s, "d/2", "d/2")
	if got := listKeys(t, s, ""); !slices.Equal(got, []string{"keep"}) {
		t.Fatalf("after Delete, List = %q, want [keep]", got)
	}
	// A deleted key can be written again, also where its directory was.
	mustPut(t, s, "d/sub/3", []byte("again"))
	if got := mustGet(t, s, "d/sub/3"); string(got) != "again" {
		t.Fatalf("Get after re-Put = %q", got)
	}
}

func testHead(t *testing.T, s objstore.Store) {
	// S3 reports Last-Modified in whole seconds, from the server's clock.
	const slack = 2 * time.Second
	before := time.Now()
	mustPut(t, s, "h/obj", make([]byte, 1234))
	mustPut(t, s, "h/empty", nil)
	after := time.Now()
	for key, size := range map[string]int64{"h/obj": 1234, "h/empty": 0} {
		info := mustHead(t, s, key)
		if info.Key != key || info.Size != size {
			t.Errorf("Head(%q) = key %q size %d, want key %q size %d", key, info.Key, info.Size, key, size)
		}
		if info.Modified.Before(before.Add(-slack)) || info.Modified.After(after.Add(slack)) {
			t.Errorf("Head(%q).Modified = %v, want between %v and %v", key, info.Modified, before, after)
		}
	}
}

// specialKeys are valid keys with characters that need escaping somewhere.
var specialKeys = []string{
	"with space/a b c",
	"percent/100%",
	"percent/%2F%20",
	"plus+and=equals&amp",
	"query?x=1#frag",
	"unicode/日本語/ключ/ü",
	"emoji/🙂",
	"punct/!$'()*,;:@[]~",
	".hidden/.dotfile",
	"...three-dots",
	"trailing-space ",
}

func testSpecialKeys(t *testing.T, s objstore.Store) {
	ctx := t.Context()
	for _, key := range specialKeys {
		mustPut(t, s, key, []byte(key))
	}
	for _, key := range specialKeys {
		if got := mustGet(t, s, key); string(got) != key {
			t.Errorf("Get(%q) = %q", key, got)
		}
		if info := mustHead(t, s, key); info.Key != key || info.Size != int64(len(key)) {
			t.Errorf("Head(%q) = %+v", key, info)
		}
		got, err := s.GetRange(ctx, key, 1, 2)
		if err != nil || string(got) != key[1:3] {
			t.Errorf("GetRange(%q, 1, 2) = %q, %v; want %q", key, got, err, key[1:3])
		}
	}
	want := slices.Sorted(slices.Values(specialKeys))
	if got := listKeys(t, s, ""); !slices.Equal(got, want) {
		t.Errorf("List = %q, want %q", got, want)
	}
	if got := listKeys(t, s, "percent/100"); !slices.Equal(got, []string{"percent/100%"}) {
		t.Errorf("List(percent/100) = %q", got)
	}
	if created, err := s.PutIfAbsent(ctx, specialKeys[0], nil); err != nil || created {
		t.Errorf("PutIfAbsent(%q) of an existing key = %v, %v", specialKeys[0], created, err)
	}
	mustDelete(t, s, specialKeys...)
	if got := listKeys(t, s, ""); len(got) != 0 {
		t.Errorf("after Delete, List = %q", got)
	}
}

// InvalidKeys are keys every store must reject (objstore.ValidateKey).
var InvalidKeys = []string{
	"",
	"/leading",
	"trailing/",
	"double//slash",
	".",
	"..",
	"a/../b",
	"../escape",
	"a/./b",
	"a/..",
	`back\slash`,
	"nul\x00byte",
	"control\x01char",
	"newline\nkey",
	"del\x7f",
	"bad-utf8-\xff",
	".objstore-tmp-123",
	"dir/.objstore-tmp",
	strings.Repeat("k", objstore.MaxKeyBytes+1),
}

func testInvalidKeys(t *testing.T, s objstore.Store) {
	ctx := t.Context()
	for _, key := range InvalidKeys {
		checkInvalid := func(op string, err error) {
			t.Helper()
			if !errors.Is(err, objstore.ErrInvalidKey) {
				t.Errorf("%s %q: err = %v, want ErrInvalidKey", op, key, err)
				return
			}
			if !strings.Contains(err.Error(), "invalid key") {
				t.Errorf("%s %q: error %q does not say the key is invalid", op, key, err)
			}
		}
		checkInvalid("put", s.Put(ctx, key, []byte("x")))
		_, err := s.PutIfAbsent(ctx, key, []byte("x"))
		checkInvalid("put-if-absent", err)
		_, err = s.Get(ctx, key)
		checkInvalid("get", err)
		_, err = s.GetRange(ctx, key, 0, 1)
		checkInvalid("get-range", err)
		_, err = s.Head(ctx, key)
		checkInvalid("head", err)
		checkInvalid("delete", s.Delete(ctx, "fine", key))
	}
	for _, prefix := range []string{"/a", "a/../b", "a//b", `a\b`, "x\x00"} {
		err := s.List(ctx, prefix, func(objstore.Info) error { return nil })
		if !errors.Is(err, objstore.ErrInvalidKey) {
			t.Errorf("List(%q): err = %v, want ErrInvalidKey", prefix, err)
		}
	}
	if got := listKeys(t, s, ""); len(got) != 0 {
		t.Errorf("invalid keys wrote objects: %q", got)
	}
}

// testConcurrentPutDelete writes and deletes keys sharing directories from
// several goroutines, so a store that removes empty directories races with
// writers that need them.
func testConcurrentPutDelete(t *testing.T, s objstore.Store) {
	const workers, rounds = 4, 15
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				key := fmt.Sprintf("shared/dir/w%d", w)
				body := fmt.Appendf(nil, "%d/%d", w, r)
				if err := s.Put(ctx, key, body); err != nil {
					errs <- err
					return
				}
				got, err := s.Get(ctx, key)
				if err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(got, body) {
					errs <- fmt.Errorf("get %q = %q, want %q", key, got, body)
					return
				}
				if err := s.Delete(ctx, key); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if got := listKeys(t, s, ""); len(got) != 0 {
		t.Errorf("after concurrent put/delete, List = %q", got)
	}
}

func testLargeObject(t *testing.T, s objstore.Store) {
	ctx := t.Context()
	body := make([]byte, LargeObjectSize)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(body); i += 8 {
		v := rng.Uint64()
		for j := range 8 {
			body[i+j] = byte(v >> (8 * j))
		}
	}
	mustPut(t, s, "large/object", body)
	got := mustGet(t, s, "large/object")
	if sha256.Sum256(got) != sha256.Sum256(body) {
		t.Fatalf("Get of the large object: %d bytes, sha256 differs", len(got))
	}
	off, n := int64(PartBoundary-100), int64(200)
	part, err := s.GetRange(ctx, "large/object", off, n)
	if err != nil {
		t.Fatalf("GetRange across the part boundary: %v", err)
	}
	if !bytes.Equal(part, body[off:off+n]) {
		t.Fatalf("GetRange(%d, %d) across the part boundary: wrong bytes", off, n)
	}
	tail, err := s.GetRange(ctx, "large/object", LargeObjectSize-10, 100)
	if err != nil || !bytes.Equal(tail, body[LargeObjectSize-10:]) {
		t.Fatalf("GetRange of the tail = %d bytes, %v", len(tail), err)
	}
	if info := mustHead(t, s, "large/object"); info.Size != LargeObjectSize {
		t.Fatalf("Head size %d, want %d", info.Size, LargeObjectSize)
	}
	// A large PutIfAbsent on an existing key changes nothing.
	other := bytes.Clone(body)
	other[0] ^= 0xff
	created, err := s.PutIfAbsent(ctx, "large/object", other)
	if err != nil || created {
		t.Fatalf("large PutIfAbsent of an existing key = %v, %v; want false, nil", created, err)
	}
	created, err = s.PutIfAbsent(ctx, "large/new", other)
	if err != nil || !created {
		t.Fatalf("large PutIfAbsent of a new key = %v, %v; want true, nil", created, err)
	}
	if got := mustGet(t, s, "large/object"); sha256.Sum256(got) != sha256.Sum256(body) {
		t.Fatal("a refused large PutIfAbsent changed the object")
	}
	if got := mustGet(t, s, "large/new"); sha256.Sum256(got) != sha256.Sum256(other) {
		t.Fatal("large PutIfAbsent of a new key: wrong content")
	}
}

func mustPut(t testing.TB, s objstore.Store, key string, body []byte) {
	t.Helper()
	if err := s.Put(t.Context(), key, body); err != nil {
		t.Fatalf("Put(%q): %v", key, err)
	}
}

func mustGet(t testing.TB, s objstore.Store, key string) []byte {
	t.Helper()
	body, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return body
}

func mustHead(t testing.TB, s objstore.Store, key string) objstore.Info {
	t.Helper()
	info, err := s.Head(t.Context(), key)
	if err != nil {
		t.Fatalf("Head(%q): %v", key, err)
	}
	return info
}

func mustDelete(t testing.TB, s objstore.Store, keys ...string) {
	t.Helper()
	if err := s.Delete(t.Context(), keys...); err != nil {
		t.Fatalf("Delete(%q): %v", keys, err)
	}
}

func listKeys(t testing.TB, s objstore.Store, prefix string) []string {
	t.Helper()
	var keys []string
	err := s.List(t.Context(), prefix, func(info objstore.Info) error {
		keys = append(keys, info.Key)
		return nil
	})
	if err != nil {
		t.Fatalf("List(%q): %v", prefix, err)
	}
	return keys
}
