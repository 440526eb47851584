// Package rcache remembers recently finished receipts, so that a retry of a
// finished operation is answered with one engine read and a checksum: no key
// lock and no decoding.
//
// An entry holds a finished record's fixed fields (state, attempts, token,
// times), the epoch its key was stored under, the length and checksum of its
// stored bytes, and where its fingerprint and result lie in them. Without
// the bytes themselves it is only a memo of decoding: a reader still reads
// the engine, exactly as an uncached read does, and uses the entry only if
// the bytes it finds under the key are intact and carry the entry's
// checksum; the fingerprint and result are then taken from those bytes.
// Anything else (another record, an expired one, a corrupt one, an error)
// goes the uncached way. Entries are added only for records that are
// durable (synced), so bytes that match an entry are durable bytes.
//
// A small record's entry also holds its stored bytes (Val): the engine may
// then answer a replay from them without reading itself, under the
// conditions it documents (pebbleengine's fromCache). A record is held only
// if it is at most budget/64 and at most 1 MiB. Delete drops a key's entry;
// the engine calls it under the key lock before every write of the key.
//
// The cache is a fixed table of slots, eight-way set associative (a set is
// two cache lines), sized from the byte budget at creation: a new entry takes
// the way of the same key, or an empty way, or else the way whose record was
// written longest ago. Lookups take no lock (atomic loads only), so readers
// on different cores never contend.
//
// The entries themselves, each followed by its keys, trace context and
// held bytes, are written into chunks: large allocations of plain bytes
// (the collector does not scan them), filled in order and never written
// again, as many as fit the budget (16, for budgets from 64 KiB to
// 1 GiB). When a new one is needed and the cache holds as many, the oldest
// chunk is retired: its entries leave the table, and the garbage collector
// frees it once no reader holds one of them. So the memory is the budget,
// whatever the allocation pattern of the program around it: entries
// allocated one by one, among the program's short-lived allocations of the
// same sizes, would pin a span each, and a cache of 8 MiB held about 40 MiB
// of Go heap in a store of 1M receipts.
package rcache

import (
	"hash/maphash"
	"math"
	"math/bits"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/receiptstore/receipts/encoding"
)

// itemBytes is the size of one entry's header in its chunk, beside its
// bytes.
const itemBytes = int64(unsafe.Sizeof(item{}))

// entryGuess is the bytes an entry is assumed to hold beside its item (its
// keys and a small record's stored bytes), to size the table (New).
const entryGuess = 256

// maxSlots caps the table (the slots are allocated up front): 64Mi ways.
const maxSlots = 1 << 26

// chunksPerBudget is how many chunks a cache holds: retiring one drops
// about 1/chunksPerBudget of the entries. minChunk is the smallest chunk (a
// budget below chunksPerBudget*minChunk has fewer chunks, at least two),
// maxChunk the largest (a budget above chunksPerBudget*maxChunk has more).
const (
	chunksPerBudget = 16
	minChunk        = 4 << 10
	maxChunk        = 64 << 20
)

// Entry is one cached record.
type Entry struct {
	encoding.Layout
	Key            []byte // the record's key in the engine (shared: never modify)
	Epoch          uint64 // of Key
	Len, CRC       uint32 // of the stored bytes
	State          encoding.State
	Attempts       uint32
	Token          uint64
	CreatedAt      int64
	UpdatedAt      int64
	LeaseExpiresAt int64
	// Val is the record's stored bytes (shared: never modify), if small
	// enough to hold (nil otherwise): Matches(Val) holds.
	Val []byte
	// Trace is the record's trace context (a copy; shared: never modify),
	// or nil.
	Trace []byte
}

// Matches reports whether v, read under the entry's key at its epoch, is the
// cached record: intact, of the same length and checksum.
func (e *Entry) Matches(v []byte) bool {
	if crc, ok := encoding.StoredChecksum(v); !ok || len(v) != int(e.Len) || crc != e.CRC {
		return false
	}
	_, ok := encoding.Checksum(v)
	return ok
}

// View returns the record that v, which Matches e, holds. Its fingerprint
// and result alias v.
func (e *Entry) View(v []byte) encoding.Record {
	r := encoding.Record{
		State:          e.State,
		Fingerprint:    v[e.FpOff : e.FpOff+e.FpLen : e.FpOff+e.FpLen],
		Attempts:       e.Attempts,
		Token:          e.Token,
		CreatedAt:      e.CreatedAt,
		UpdatedAt:      e.UpdatedAt,
		LeaseExpiresAt: e.LeaseExpiresAt,
		Trace:          e.Trace,
	}
	if !e.ResNil {
		r.Result = v[e.ResOff : e.ResOff+e.ResLen : e.ResOff+e.ResLen]
	}
	return r
}

// Cache is a bounded map from a key to its finished record. A nil *Cache is
// a disabled cache: Get finds nothing, Put and Sweep do nothing.
type Cache struct {
	seed  maphash.Seed
	mask  uint64 // len(slots)-1; len(slots) is a power of two, at least ways
	slots []slot
	// maxVal is the largest record whose bytes an entry holds.
	maxVal int64
	// chunkBytes is the memory of one chunk, nchunks the most chunks held.
	chunkBytes int64
	nchunks    int
	held       atomic.Int64 // bytes of the chunks held

	mu     sync.Mutex // Put's: the chunks, and the contents of the ways
	chunks []*chunk   // oldest first; entries are added to the last

	// Admission (hit, admit): retired counts the chunks retired; hitAt is
	// retired at the last hit. Both are written once per chunk at most (a
	// retirement, the first hit after it), so readers on other cores keep
	// their line; it is a line of their own, away from mu.
	_       [64]byte
	retired atomic.Uint64
	hitAt   atomic.Uint64
	_       [48]byte
}

// sampled is the share of keys a starving cache admits: 1 in
// 1<<sampledBits, by their hash.
const sampledBits = 4

// hit notes that Get found an entry. While none was found since the cache
// retired as many chunks as it holds (every entry in it was put after the
// last hit, and all before went unasked), the working set does not fit it:
// Put then admits only a sample of the keys (1 in 16, by hash). That keeps
// the cost of filling a cache whose entries leave unread (a record's copy,
// the chunks' memory streaming through the CPU's caches) off the write
// path, and lets a hit be seen again, which admits every key from then on.
func (c *Cache) hit() {
	if r := c.retired.Load(); c.hitAt.Load() != r {
		c.hitAt.Store(r)
	}
}

// admit reports whether Put keeps an entry for the key whose hash is h.
func (c *Cache) admit(h uint64) bool {
	return c.retired.Load()-c.hitAt.Load() < uint64(c.nchunks) || h>>(64-sampledBits) == 0
}

// chunk holds entries, each an item followed by its bytes, written in
// order at 8-byte aligned offsets and never again. buf never grows beyond
// its capacity: entries are handed out by pointer.
type chunk struct {
	buf []byte
}

// size is the memory ck takes.
func (ck *chunk) size() int64 { return int64(cap(ck.buf)) }

// maxValPart is the largest part of the budget one record's held bytes may
// take (1/64, and at most maxValLen, and half a chunk).
const (
	maxValPart = 64
	maxValLen  = 1 << 20
)

// ways is the number of slots in a set: 8 x 16 bytes, two cache lines.
// With four, and two slots per expected entry, a replay benchmark over 10k
// receipts (which a default cache holds) missed 2.9% of its lookups: the
// keys of a set that drew more than its ways evicted each other, and every
// miss's Put took chunk space, so chunks retired and dropped more. With
// eight ways and four slots per expected entry, it missed none.
const ways = 8

// slot holds an item and its key's hash (tag), read before the item so that
// a scan of a set dereferences only the item it wants. The item itself is
// the truth: the two are not updated together. But since every change of
// a way that is not to nil is a Put, and Puts are serialized (c.mu), a way
// that holds an item holds its key's hash as its tag, except within the
// Put that stored the item, between its two stores (p, then tag). A Put
// of another key that takes the way over stores its own item before its
// tag, so a tag read after the item left shows nothing wrong. So a Get, or
// a Delete or Put of the same key (which run under the key's lock, so
// never within that window), may skip a way whose tag is not the key's
// hash: it does not hold the key's item. (Were a way to hold the key's
// item under another tag, Get would not find it there either, so dropping
// only what Get can find is enough for Delete.)
type slot struct {
	tag atomic.Uint64
	p   atomic.Pointer[item]
}

// item is an entry as it lies in its chunk. Its bytes follow it: the key
// it was put under, the record key, the trace context, and the record's
// stored bytes if held. So the key compared by a lookup sits beside the
// item's fields, in the cache lines the lookup reads anyway (apart, they
// were one more cache miss per replay answered from memory: a third of its
// time). It holds no pointers, so a chunk is plain bytes that the
// collector does not scan.
type item struct {
	// h is the hash of the key the entry was put under: compared before
	// the key itself, so that a scan of a set (Delete, Put) reads the key
	// bytes of no item but its own key's.
	h uint64
	encoding.Layout
	keyLen, recKeyLen, traceLen, valLen  uint32 // the bytes that follow
	epoch                                uint64
	len, crc                             uint32
	attempts                             uint32
	state                                encoding.State
	token                                uint64
	createdAt, updatedAt, leaseExpiresAt int64
}

// itemAlign is the alignment of items in a chunk.
const itemAlign = 8

// entrySize is the bytes an entry holding n bytes takes in its chunk.
func entrySize(n int) int {
	return (int(itemBytes) + n + itemAlign - 1) &^ (itemAlign - 1)
}

// bytes returns the n bytes that follow it in its chunk.
func (it *item) bytes(n uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(it), itemBytes)), n)
}

// size is the bytes it takes in its chunk, with its bytes.
func (it *item) size() int {
	return entrySize(int(it.keyLen + it.recKeyLen + it.traceLen + it.valLen))
}

// is reports whether it was put under key, whose hash is h.
func (it *item) is(key []byte, h uint64) bool {
	return it.h == h && int(it.keyLen) == len(key) && string(it.bytes(it.keyLen)) == string(key)
}

// entry returns it as an Entry, whose slices alias its chunk.
func (it *item) entry() Entry {
	b := it.bytes(it.keyLen + it.recKeyLen + it.traceLen + it.valLen)
	o := it.keyLen
	e := Entry{
		Layout: it.Layout, Key: b[o : o+it.recKeyLen : o+it.recKeyLen], Epoch: it.epoch, Len: it.len, CRC: it.crc,
		State: it.state, Attempts: it.attempts, Token: it.token,
		CreatedAt: it.createdAt, UpdatedAt: it.updatedAt, LeaseExpiresAt: it.leaseExpiresAt,
	}
	o += it.recKeyLen
	if it.traceLen > 0 {
		e.Trace = b[o : o+it.traceLen : o+it.traceLen]
	}
	o += it.traceLen
	if it.valLen > 0 {
		e.Val = b[o : o+it.valLen : o+it.valLen]
	}
	return e
}

// New returns a cache that holds about size bytes (nil if size <= 0), or
// at least about 8 KiB.
func New(size int64) *Cache {
	if size <= 0 {
		return nil
	}
	// Four slots per expected entry, two to four after rounding down: with
	// the chunks full, a set of eight holds two to four entries on average
	// and seldom more than eight, so that the chunks, retired oldest first,
	// are what decides how long an entry stays, not a set's overflow.
	n := min(max(4*uint64(size/(itemBytes+entryGuess)), ways), maxSlots)
	n = 1 << (63 - bits.LeadingZeros64(n)) // round down to a power of two
	rest := size - int64(n)*int64(unsafe.Sizeof(slot{}))
	chunkBytes := min(max(rest/chunksPerBudget, minChunk), maxChunk)
	nch := int(min(max(rest/chunkBytes, 2), math.MaxInt32))
	return &Cache{seed: maphash.MakeSeed(), mask: n - 1, slots: make([]slot, n),
		maxVal: min(size/maxValPart, maxValLen, chunkBytes/2), chunkBytes: chunkBytes, nchunks: nch}
}

// set returns key's set and key's hash.
func (c *Cache) set(key []byte) ([]slot, uint64) {
	h := maphash.Bytes(c.seed, key)
	return c.setOf(h), h
}

// setOf returns the set of the keys whose hash is h.
func (c *Cache) setOf(h uint64) []slot {
	i := h & c.mask &^ (ways - 1)
	return c.slots[i : i+ways : i+ways]
}

// Get returns key's entry, and whether there is one. Entries are
// immutable: the slices of the one returned alias the cache's memory.
func (c *Cache) Get(key []byte) (Entry, bool) {
	if c == nil {
		return Entry{}, false
	}
	set, h := c.set(key)
	for w := range set {
		if set[w].tag.Load() != h {
			continue
		}
		if it := set[w].p.Load(); it != nil && it.is(key, h) {
			c.hit()
			return it.entry(), true
		}
	}
	return Entry{}, false
}

// Put caches the finished record r, stored under recKey (in epoch), for
// key. Pending records are not cached. recKey is copied.
//
// REQUIRES: r is durable (its write has been synced) and stored under
// recKey, encoded as encoding.EncodeRecord(r); key's lock is held or r was
// read under it.
func (c *Cache) Put(key, recKey []byte, epoch uint64, r *encoding.Record) {
	c.PutEncoded(key, recKey, epoch, r, nil)
}

// encBufs holds PutEncoded's encoding buffers (it copies what it keeps),
// up to maxPooledEnc bytes each.
var encBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

const maxPooledEnc = 64 << 10

// PutEncoded is Put for a record whose stored bytes the caller has: enc,
// as written to the engine (encoding.EncodeRecord(r)) or as read from it (r
// decoded from it). The entry holds a copy of enc if it holds the bytes
// (Entry.Val), so that it describes exactly what the engine holds. If enc
// is nil, or not laid out as encoding.EncodeRecord lays records out
// (RecordLayout fails), r is encoded here instead, as Put does. enc's
// checksum is taken as stored, not checked again: enc must be intact
// (encoded, or accepted by encoding.DecodeRecord).
func (c *Cache) PutEncoded(key, recKey []byte, epoch uint64, r *encoding.Record, enc []byte) {
	if c == nil || r.State == encoding.StatePending || len(r.Journal) > 0 {
		return // a record with a step journal is read from the store: entries carry no journal
	}
	set, h := c.set(key)
	if !c.admit(h) {
		c.drop(set, key, h) // whatever it held for key: none
		return
	}
	l, err := encoding.RecordLayout(enc)
	if err != nil {
		bp := encBufs.Get().(*[]byte)
		enc = encoding.AppendRecord((*bp)[:0], r)
		defer func() {
			if cap(enc) <= maxPooledEnc {
				*bp = enc[:0]
				encBufs.Put(bp)
			}
		}()
		if l, err = encoding.RecordLayout(enc); err != nil {
			return // cannot happen for an encoding of ours; cache nothing
		}
	}
	crc, _ := encoding.StoredChecksum(enc) // enc was just encoded, or decoded: intact
	need := len(key) + len(recKey) + len(r.Trace)
	c.mu.Lock()
	defer c.mu.Unlock()
	var ck *chunk
	val := int64(len(enc)) <= c.maxVal
	if val {
		if ck = c.room(need + len(enc)); ck == nil {
			val = false
		}
	}
	if !val {
		ck = c.room(need)
	}
	if ck == nil { // keys longer than half a chunk: hold nothing for key
		c.drop(set, key, h)
		return
	}
	at := len(ck.buf)
	n := need
	if val {
		n += len(enc)
	}
	ck.buf = ck.buf[:at+entrySize(n)]
	it := (*item)(unsafe.Pointer(&ck.buf[at]))
	*it = item{h: h, Layout: l, keyLen: uint32(len(key)), recKeyLen: uint32(len(recKey)), traceLen: uint32(len(r.Trace)),
		epoch: epoch, len: uint32(len(enc)), crc: crc, state: r.State, attempts: r.Attempts, token: r.Token,
		createdAt: r.CreatedAt, updatedAt: r.UpdatedAt, leaseExpiresAt: r.LeaseExpiresAt}
	if val {
		it.valLen = uint32(len(enc))
	}
	b := it.bytes(uint32(n))
	o := copy(b, key)
	o += copy(b[o:], recKey)
	o += copy(b[o:], r.Trace)
	if val {
		copy(b[o:], enc)
	}
	// The way of the same key, else an empty way, else the way whose
	// record was written longest ago.
	var olds [ways]*item
	victim := -1
	for w := range set {
		olds[w] = set[w].p.Load()
		if victim < 0 && olds[w] != nil && set[w].tag.Load() == h && olds[w].is(key, h) {
			victim = w // key's own way (a way holding key's item has h as its tag: slot)
		}
	}
	if victim < 0 {
		victim = slices.Index(olds[:], nil)
	}
	if victim < 0 {
		victim = 0
		for w, old := range olds {
			if old.updatedAt < olds[victim].updatedAt {
				victim = w
			}
		}
	}
	set[victim].p.Store(it)
	set[victim].tag.Store(h)
}

// room returns a chunk with room for one more entry holding n bytes: the
// newest, or a new one, for which it retires the oldest if the cache holds
// nchunks. It returns nil if the entry would take more than half a chunk.
//
// REQUIRES: c.mu is held.
func (c *Cache) room(n int) *chunk {
	need := entrySize(n)
	if k := len(c.chunks); k > 0 {
		if ck := c.chunks[k-1]; cap(ck.buf)-len(ck.buf) >= need {
			return ck
		}
	}
	if int64(need) > c.chunkBytes/2 {
		return nil
	}
	for len(c.chunks) >= c.nchunks {
		c.retire()
	}
	ck := &chunk{buf: make([]byte, 0, c.chunkBytes)}
	c.chunks = append(c.chunks, ck)
	c.held.Add(ck.size())
	return ck
}

// retire drops the oldest chunk's entries from the table, and the chunk.
//
// REQUIRES: c.mu is held.
func (c *Cache) retire() {
	ck := c.chunks[0]
	for at := 0; at < len(ck.buf); {
		it := (*item)(unsafe.Pointer(&ck.buf[at]))
		for w, set := 0, c.setOf(it.h); w < ways; w++ {
			set[w].p.CompareAndSwap(it, nil)
		}
		at += it.size()
	}
	n := copy(c.chunks, c.chunks[1:])
	c.chunks[n] = nil // the array beyond len must not keep a retired chunk
	c.chunks = c.chunks[:n]
	c.held.Add(-ck.size())
	c.retired.Add(1)
}

// drop removes key's entry (hash h) from its set, if there.
func (c *Cache) drop(set []slot, key []byte, h uint64) {
	for w := range set {
		if set[w].tag.Load() != h {
			continue // not key's item (slot); nor would Get find it there
		}
		if it := set[w].p.Load(); it != nil && it.is(key, h) {
			set[w].p.CompareAndSwap(it, nil)
		}
	}
}

// Delete drops key's entry, if any: a later Get finds none until the next
// Put for key.
//
// REQUIRES: key's lock is held (so no Put for key runs concurrently).
func (c *Cache) Delete(key []byte) {
	if c == nil {
		return
	}
	set, h := c.set(key)
	c.drop(set, key, h)
}

// Sweep drops the entries for which expired(UpdatedAt) is true.
func (c *Cache) Sweep(expired func(updatedAt int64) bool) (dropped int) {
	if c == nil {
		return 0
	}
	for i := range c.slots {
		if it := c.slots[i].p.Load(); it != nil && expired(it.updatedAt) && c.slots[i].p.CompareAndSwap(it, nil) {
			dropped++
		}
	}
	return dropped
}

// Len returns the number of entries, and the bytes the cache takes: its
// table and its chunks.
func (c *Cache) Len() (entries int, bytes int64) {
	if c == nil {
		return 0, 0
	}
	for i := range c.slots {
		if c.slots[i].p.Load() != nil {
			entries++
		}
	}
	return entries, int64(len(c.slots))*int64(unsafe.Sizeof(slot{})) + c.held.Load()
}
