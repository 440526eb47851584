package rcache

import (
	"bytes"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"unsafe"

	"github.com/receiptstore/receipts/encoding"
)

func finished(i int, result []byte) *encoding.Record {
	return &encoding.Record{
		State:       encoding.StateSucceeded,
		Fingerprint: []byte(fmt.Sprintf("fp-%d", i)),
		Result:      result,
		Attempts:    1,
		Token:       uint64(i),
		CreatedAt:   int64(i),
		UpdatedAt:   int64(i),
	}
}

func TestPutGetView(t *testing.T) {
	c := New(1 << 20)
	for _, res := range [][]byte{nil, {}, []byte("result")} {
		r := finished(7, res)
		c.Put([]byte("k"), []byte("record-key"), 3, r)
		e := get(c, []byte("k"))
		if e == nil {
			t.Fatalf("no entry after Put")
		}
		if e.Epoch != 3 || string(e.Key) != "record-key" {
			t.Fatalf("entry key %q epoch %d", e.Key, e.Epoch)
		}
		enc := encoding.EncodeRecord(r)
		if !e.Matches(enc) {
			t.Fatalf("entry does not match its own encoding")
		}
		got := e.View(enc)
		want, err := encoding.DecodeRecord(enc)
		if err != nil {
			t.Fatal(err)
		}
		if got.State != want.State || !bytes.Equal(got.Fingerprint, want.Fingerprint) || !bytes.Equal(got.Result, want.Result) ||
			(got.Result == nil) != (want.Result == nil) || got.Token != want.Token || got.UpdatedAt != want.UpdatedAt {
			t.Fatalf("view %+v, decoded %+v", got, *want)
		}
		// Any other bytes do not match: a flipped bit, a truncation, another record.
		for i := range enc {
			bad := bytes.Clone(enc)
			bad[i] ^= 0x10
			if e.Matches(bad) {
				t.Fatalf("matches with byte %d flipped", i)
			}
		}
		if e.Matches(enc[:len(enc)-1]) || e.Matches(nil) || e.Matches(encoding.EncodeRecord(finished(8, res))) {
			t.Fatalf("matches other bytes")
		}
	}
	if get(c, []byte("other")) != nil {
		t.Fatalf("entry for a key never put")
	}
}

func TestPendingNotCached(t *testing.T) {
	c := New(1 << 20)
	r := finished(1, nil)
	r.State = encoding.StatePending
	c.Put([]byte("k"), []byte("rk"), 1, r)
	if get(c, []byte("k")) != nil {
		t.Fatalf("a pending record was cached")
	}
}

func TestDisabled(t *testing.T) {
	var c *Cache = New(0)
	if c != nil {
		t.Fatalf("New(0) is not disabled")
	}
	c.Put([]byte("k"), []byte("rk"), 1, finished(1, nil))
	if get(c, []byte("k")) != nil || c.Sweep(func(int64) bool { return true }) != 0 {
		t.Fatalf("a disabled cache holds something")
	}
	if n, b := c.Len(); n != 0 || b != 0 {
		t.Fatalf("disabled cache Len %d %d", n, b)
	}
}

func TestBoundedAndReplacesOldest(t *testing.T) {
	c := New(4 << 10)
	slots := len(c.slots)
	for i := range 10 * slots {
		c.Put([]byte(fmt.Sprintf("k%d", i)), []byte("rk"), 1, finished(i, []byte("r")))
	}
	n, _ := c.Len()
	if n > slots {
		t.Fatalf("%d entries in %d slots", n, slots)
	}
	// A set holds the most recently written records among those put into
	// it: a new one evicts the oldest.
	c = New(1) // one set
	if len(c.slots) != ways {
		t.Fatalf("New(1): %d slots, want one set of %d", len(c.slots), ways)
	}
	// a is written at 10, the oldest; the others at 20, 30, ...
	var kept []string
	for i := range ways {
		k := "a"
		if i > 0 {
			k = fmt.Sprint("k", i)
			kept = append(kept, k)
		}
		c.Put([]byte(k), []byte("rk"), 1, finished(10*(i+1), nil))
	}
	c.Put([]byte("e"), []byte("rk"), 1, finished(10*(ways+1), nil)) // evicts a
	if get(c, []byte("a")) != nil {
		t.Fatalf("did not evict the oldest")
	}
	for _, k := range append(kept, "e") {
		if get(c, []byte(k)) == nil {
			t.Fatalf("evicted %s, not the oldest", k)
		}
	}
	c.Put([]byte("k1"), []byte("rk2"), 2, finished(10*(ways+2), nil)) // same key: replaced in place
	if e := get(c, []byte("k1")); e == nil || e.Epoch != 2 || get(c, []byte("k2")) == nil || get(c, []byte("e")) == nil {
		t.Fatalf("same key not replaced in place")
	}
	if n, _ := c.Len(); n != ways {
		t.Fatalf("%d entries in one set", n)
	}
}

func TestSweep(t *testing.T) {
	c := New(1 << 20)
	for i := range 100 {
		c.Put([]byte(fmt.Sprintf("k%d", i)), []byte("rk"), 1, finished(i, nil))
	}
	if got := c.Sweep(func(updated int64) bool { return updated < 50 }); got != 50 {
		t.Fatalf("swept %d, want 50", got)
	}
	for i := range 100 {
		if got := get(c, []byte(fmt.Sprintf("k%d", i))) != nil; got != (i >= 50) {
			t.Fatalf("key %d cached %v after sweep", i, got)
		}
	}
}

// Readers and writers at once (run with -race): a reader sees a whole entry
// of the key it asked for, or none.
func TestConcurrent(t *testing.T) {
	c := New(8 << 10)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				k := []byte(fmt.Sprintf("k%d", (i*7+w)%300))
				if w%2 == 0 {
					c.Put(k, k, uint64(i), finished(i, k))
				} else if e := get(c, k); e != nil && !bytes.Equal(e.Key, k) {
					t.Errorf("entry of %q under %q", e.Key, k)
					return
				}
			}
		}()
	}
	wg.Wait()
}

func TestSizes(t *testing.T) {
	for _, tc := range []struct {
		size  int64
		slots int
	}{{1, ways}, {2 * (itemBytes + entryGuess), ways}, {4 * (itemBytes + entryGuess), 16}, {8 << 20, 65536}, {1 << 62, maxSlots}} {
		c := New(tc.size)
		if got := len(c.slots); got != tc.slots {
			t.Errorf("New(%d): %d slots, want %d", tc.size, got, tc.slots)
		}
		// The chunks fit the budget (beside the table), or are the
		// smallest two; none is larger than maxChunk.
		table := int64(len(c.slots)) * int64(unsafe.Sizeof(slot{}))
		if c.chunkBytes < minChunk || c.chunkBytes > maxChunk || c.maxVal > c.chunkBytes/2 ||
			(c.nchunks > 2 && int64(c.nchunks)*c.chunkBytes > tc.size-table) {
			t.Errorf("New(%d): %d chunks of %d bytes, records up to %d held", tc.size, c.nchunks, c.chunkBytes, c.maxVal)
		}
	}
}

// TestValHeld: an entry holds a copy of a small record's bytes (at most
// budget/64), not a larger one's; a replaced, deleted or swept entry is no
// longer found. (What the entries take is TestMemoryBounded's.)
func TestValHeld(t *testing.T) {
	c := New(64 << 10) // records up to 1 KiB are held
	small, big := finished(1, []byte("r")), finished(2, make([]byte, 2048))
	small.Trace = []byte("trace")
	enc := encoding.EncodeRecord(small)
	c.PutEncoded([]byte("s"), []byte("rs"), 1, small, enc)
	c.Put([]byte("b"), []byte("rb"), 1, big)
	es, eb := get(c, []byte("s")), get(c, []byte("b"))
	if es == nil || eb == nil {
		t.Fatalf("entries missing")
	}
	if !bytes.Equal(es.Val, enc) || !es.Matches(es.Val) || string(es.Trace) != "trace" || string(es.Key) != "rs" {
		t.Fatalf("small record's entry: bytes %x, trace %q, key %q", es.Val, es.Trace, es.Key)
	}
	enc[0] ^= 0xff
	small.Trace[0] = 'T'
	if !es.Matches(es.Val) || string(es.Trace) != "trace" {
		t.Fatalf("the entry shares the caller's bytes")
	}
	if eb.Val != nil {
		t.Fatalf("a record above budget/64 is held")
	}
	c.Put([]byte("s"), []byte("rs"), 1, finished(3, []byte("longer result")))
	if e := get(c, []byte("s")); e == nil || e.Token != 3 || !e.Matches(e.Val) {
		t.Fatalf("after replacing: %+v", e)
	}
	c.Delete([]byte("s"))
	c.Delete([]byte("never put"))
	if get(c, []byte("s")) != nil {
		t.Fatalf("after Delete: entry %v", get(c, []byte("s")))
	}
	if get(c, []byte("b")) == nil {
		t.Fatalf("Delete dropped another key's entry")
	}
	c.Put([]byte("s"), []byte("rs"), 1, small)
	if c.Sweep(func(int64) bool { return true }) != 2 || get(c, []byte("s")) != nil || get(c, []byte("b")) != nil {
		t.Fatalf("Sweep left entries")
	}
	var nilCache *Cache
	nilCache.Delete([]byte("k")) // a disabled cache
}

// TestMemoryBounded: whatever is put, the cache's memory stays within its
// budget (Len), the newest entries are found and the oldest are retired
// with their chunks; and the Go heap the entries keep alive is the budget,
// not a multiple of it (entries allocated one by one pinned about 40 MiB
// for an 8 MiB cache in a store of 1M receipts).
func TestMemoryBounded(t *testing.T) {
	const budget = 4 << 20
	c := New(budget)
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 100_000
	for i := range n {
		r := finished(i, make([]byte, i%300))
		if i%7 == 0 {
			r.Trace = []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
		}
		k := []byte(fmt.Sprintf("scope/key-%d", i))
		c.Put(k, append([]byte("record/"), k...), 1, r)
		if i%500 == 0 {
			if _, b := c.Len(); b > budget {
				t.Fatalf("after %d puts: %d bytes, budget %d", i+1, b, budget)
			}
		}
		if e := get(c, k); e == nil || e.Token != uint64(i) {
			t.Fatalf("put %d: the newest entry is not found", i)
		}
	}
	// The oldest entries are gone with their chunks.
	for i := range 1000 {
		if get(c, []byte(fmt.Sprintf("scope/key-%d", i))) != nil {
			t.Fatalf("entry %d of %d still cached", i, n)
		}
	}
	entries, _ := c.Len()
	if entries < budget/1024 {
		t.Fatalf("only %d entries in %d bytes", entries, budget)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > budget*5/4 {
		t.Fatalf("live heap grew by %d bytes for a %d-byte cache (%d entries)", grew, budget, entries)
	}
	runtime.KeepAlive(c)
}

// TestDeleteUnderContention: one set of four ways, one writer per key (as
// under the engine's key lock) putting and deleting its key while the
// others do theirs: after its Delete, a key is never found, whatever the
// other keys' racing Puts did to the ways and their tags; a Get finds only
// the key's latest entry or none; the held bytes add up.
func TestDeleteUnderContention(t *testing.T) {
	c := New(1) // one set
	if len(c.slots) != ways {
		t.Fatalf("%d slots", len(c.slots))
	}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := []byte(fmt.Sprint("key-", w))
			for i := range 2000 {
				r := finished(i, []byte("r"))
				c.Put(k, []byte("rk"), 1, r)
				if e := get(c, k); e != nil && e.Token != uint64(i) {
					t.Errorf("key %d: found token %d, want %d or nothing", w, e.Token, i)
					return
				}
				c.Delete(k)
				if e := get(c, k); e != nil {
					t.Errorf("key %d: found token %d after Delete", w, e.Token)
					return
				}
			}
		}()
	}
	wg.Wait()
	if n, _ := c.Len(); n > ways {
		t.Fatalf("%d entries in one set", n)
	}
}

// TestRetiredChunksUnreferenced: after many retirements, the cache refers
// to no chunk beyond those it holds (the chunk list's array included), so
// the collector can free every retired one.
func TestRetiredChunksUnreferenced(t *testing.T) {
	c := New(64 << 10)
	for i := range 20_000 {
		c.Put([]byte(fmt.Sprint("k", i)), []byte("rk"), 1, finished(i, make([]byte, 100)))
	}
	if len(c.chunks) != c.nchunks {
		t.Fatalf("%d chunks held, want %d", len(c.chunks), c.nchunks)
	}
	for i, ck := range c.chunks[len(c.chunks):cap(c.chunks)] {
		if ck != nil {
			t.Fatalf("the chunk list's array keeps a retired chunk at %d", len(c.chunks)+i)
		}
	}
	var held int64
	for _, ck := range c.chunks {
		held += ck.size()
	}
	if held != c.held.Load() {
		t.Fatalf("chunks take %d bytes, counted %d", held, c.held.Load())
	}
}

// TestHoldsWhatFits: receipts that fit the budget stay, but for the rare
// set that draws more keys than its ways. 10,000 receipts with 128-byte
// results and 44-byte keys (two thirds of what the default 8 MiB holds)
// are found after being put, and again after each has been put once more
// (a write of every key), but for at most 10 (0.1%). A set of eight ways
// here draws 1.2 keys on average; one draws nine or more in about one
// table of 25 (Poisson). With four ways per set and two slots per expected
// entry, 70-83 were lost (three seeds).
func TestHoldsWhatFits(t *testing.T) {
	for seed := range 3 {
		c := New(8 << 20)
		const n = 10000
		keys := make([][]byte, n)
		for i := range keys {
			keys[i] = []byte(fmt.Sprintf("%d/%042d", seed, i))
		}
		res := bytes.Repeat([]byte("r"), 128)
		for round := range 2 {
			for i, k := range keys {
				c.Put(k, append([]byte("record-key/"), k...), 1, finished(round*n+i, res))
			}
			missing := 0
			for _, k := range keys {
				if get(c, k) == nil {
					missing++
				}
			}
			if missing > n/1000 {
				t.Errorf("seed %d, round %d: %d of %d receipts not held", seed, round, missing, n)
			}
		}
	}
}

// get is Get with nil for no entry.
func get(c *Cache, key []byte) *Entry {
	e, ok := c.Get(key)
	if !ok {
		return nil
	}
	return &e
}

// TestEntryOutlivesRetirement: an Entry got before its chunk is retired
// keeps its bytes (key, trace, held record) intact through collections and
// new allocations: its slices keep the retired chunk alive. The entries
// lie in plain bytes the collector does not scan, so this is what holds a
// reader's entry.
func TestEntryOutlivesRetirement(t *testing.T) {
	c := New(64 << 10)
	r := finished(1, bytes.Repeat([]byte("result"), 10))
	r.Trace = []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	enc := encoding.EncodeRecord(r)
	c.PutEncoded([]byte("k"), []byte("record-key"), 1, r, enc)
	e, ok := c.Get([]byte("k"))
	if !ok || e.Val == nil || e.Trace == nil {
		t.Fatalf("entry %v, %v: want one holding its bytes and trace", e, ok)
	}
	for i := 0; get(c, []byte("k")) != nil; i++ { // until its chunk retires
		c.Put([]byte(fmt.Sprint("other-", i)), []byte("rk"), 1, finished(i, bytes.Repeat([]byte("x"), 100)))
	}
	var junk [][]byte
	for range 4 {
		runtime.GC()
		for range 1000 {
			junk = append(junk, bytes.Repeat([]byte{0xff}, 64<<10/16))
		}
		junk = junk[:0]
	}
	if string(e.Key) != "record-key" || !bytes.Equal(e.Val, enc) || !bytes.Equal(e.Trace, r.Trace) || !e.Matches(e.Val) {
		t.Fatalf("retired entry changed: key %q, trace %q, val %x", e.Key, e.Trace, e.Val)
	}
	if v := e.View(e.Val); !bytes.Equal(v.Result, r.Result) || !bytes.Equal(v.Fingerprint, r.Fingerprint) {
		t.Fatalf("retired entry's view: %q %q", v.Fingerprint, v.Result)
	}
}

// TestAdmission: a cache whose entries all leave unread (as many chunks retired as it
// holds, with no Get finding anything) admits only a sample of the keys, about 1 in
// 1<<sampledBits; a Put it does not admit leaves no entry for the key, not even an
// older one; once a Get finds an entry, every key is admitted again.
func TestAdmission(t *testing.T) {
	c := New(64 << 10)
	put := func(i int) {
		k := []byte(fmt.Sprintf("scope/key-%d", i))
		c.Put(k, append([]byte("record/"), k...), 1, finished(i, make([]byte, 100)))
	}
	i := 0
	for c.retired.Load() < uint64(c.nchunks) { // fills the cache through, no Get
		put(i)
		i++
	}
	if c.admit(0x1) != true || c.admit(1<<63) != false {
		t.Fatalf("a starving cache admits by hash: admit(1) %v, admit(1<<63) %v", c.admit(1), c.admit(1<<63))
	}
	// An older entry of a key it does not admit goes.
	var old []byte
	for j := 0; ; j++ {
		k := []byte(fmt.Sprintf("scope/old-%d", j))
		if _, h := c.set(k); h>>(64-sampledBits) != 0 {
			old = k
			break
		}
	}
	c.retired.Add(-uint64(c.nchunks)) // admitting for a moment (no Get: hitAt unchanged)
	c.Put(old, []byte("record/old"), 1, finished(0, nil))
	c.retired.Add(uint64(c.nchunks))
	c.Put(old, []byte("record/old"), 1, finished(1, nil))
	if c.hitAt.Load() != 0 {
		t.Fatalf("hitAt %d: no Get found anything", c.hitAt.Load())
	}
	if e := get(c, old); e != nil {
		t.Fatalf("a Put not admitted left an entry: %+v", e)
	}
	// A sample is admitted.
	start, admitted := i, 0
	for ; i < start+4096; i++ {
		put(i)
	}
	for j := start; j < i; j++ {
		k := []byte(fmt.Sprintf("scope/key-%d", j))
		if _, h := c.set(k); h>>(64-sampledBits) == 0 {
			admitted++
		} else if e := get(c, k); e != nil { // finds nothing: no hit
			t.Fatalf("key %d, not in the sample, cached", j)
		}
	}
	if admitted < 4096/(1<<sampledBits)/2 || admitted > 4096/(1<<sampledBits)*2 {
		t.Fatalf("%d of 4096 keys in the sample", admitted)
	}
	// The first hit admits every key again.
	var found bool
	for j := start; j < i && !found; j++ {
		found = get(c, []byte(fmt.Sprintf("scope/key-%d", j))) != nil
	}
	if !found {
		t.Fatalf("no sampled key cached")
	}
	for j := i; j < i+100; j++ {
		put(j)
		if get(c, []byte(fmt.Sprintf("scope/key-%d", j))) == nil {
			t.Fatalf("key %d not admitted after a hit", j)
		}
	}
}
