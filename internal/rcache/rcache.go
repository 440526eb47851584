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
// conditions it documents (pebbleengine's fromCache). The bytes held are
// capped at half the budget (maxValShare), and a record is held only if it
// is at most budget/64 and at most 1 MiB. Delete drops a key's entry; the
// engine calls it under the key lock before every write of the key.
//
// The cache is a fixed table of slots, four-way set associative (a set is
// one cache line), sized from the byte budget at creation: a new entry takes
// the way of the same key, or an empty way, or else the way whose record was
// written longest ago. Lookups take no lock (atomic loads only), so readers
// on different cores never contend.
package rcache

import (
	"bytes"
	"encoding/binary"
	"hash/maphash"
	"math/bits"
	"slices"
	"sync/atomic"

	"github.com/receiptstore/receipts/encoding"
)

// entryBytes approximates what one entry costs beside its key: its slot, the
// entry and the allocation overhead.
const entryBytes = 144

// avgKey is the key length assumed when sizing the table.
const avgKey = 48

// maxSlots caps the table (the slots are allocated up front): 64Mi entries,
// about 12 GiB of receipts.
const maxSlots = 1 << 26

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
	if len(v) != int(e.Len) || binary.BigEndian.Uint32(v[len(v)-4:]) != e.CRC {
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
	// maxVal is the largest record whose bytes an entry holds; valCap the
	// bytes all entries hold at most; valBytes what they hold now.
	maxVal, valCap int64
	valBytes       atomic.Int64
}

// maxValShare is the share of the budget the held bytes may take (1/2), and
// maxValPart the largest part of it one record may take (1/64, and at most
// maxValLen).
const (
	maxValShare = 2
	maxValPart  = 64
	maxValLen   = 1 << 20
)

// ways is the number of slots in a set: 4 x 16 bytes, one cache line.
const ways = 4

// slot holds an item and its key's hash. The hash is only a filter, read
// before the item, so that a lookup dereferences only the item it wants;
// the item itself is the truth (the two are not updated together).
type slot struct {
	tag atomic.Uint64
	p   atomic.Pointer[item]
}

type item struct {
	// h is the hash of the key the entry was put under: compared before
	// the key itself, so that a scan of a set (Delete, Put) reads the key
	// bytes of no item but its own key's.
	h uint64
	// keys is the record key (Entry.Key) followed by the key the entry
	// was put under: one allocation, and one cache miss, for both.
	keys []byte
	Entry
}

// is reports whether it was put under key, whose hash is h.
func (it *item) is(key []byte, h uint64) bool {
	return it.h == h && string(it.keys[len(it.Key):]) == string(key)
}

// New returns a cache that holds about size bytes (nil if size <= 0).
func New(size int64) *Cache {
	if size <= 0 {
		return nil
	}
	n := min(max(uint64(size)/(entryBytes+avgKey), ways), maxSlots)
	n = 1 << (63 - bits.LeadingZeros64(n)) // round down to a power of two
	return &Cache{seed: maphash.MakeSeed(), mask: n - 1, slots: make([]slot, n),
		maxVal: min(size/maxValPart, maxValLen), valCap: size / maxValShare}
}

// set returns key's set and key's hash.
func (c *Cache) set(key []byte) ([]slot, uint64) {
	h := maphash.Bytes(c.seed, key)
	i := h & c.mask &^ (ways - 1)
	return c.slots[i : i+ways : i+ways], h
}

// Get returns key's entry, or nil. Entries are immutable.
func (c *Cache) Get(key []byte) *Entry {
	if c == nil {
		return nil
	}
	set, h := c.set(key)
	for w := range set {
		if set[w].tag.Load() != h {
			continue
		}
		if it := set[w].p.Load(); it != nil && it.is(key, h) {
			return &it.Entry
		}
	}
	return nil
}

// Put caches the finished record r, stored under recKey (in epoch), for
// key. Pending records are not cached. recKey is copied.
//
// REQUIRES: r is durable (its write has been synced) and stored under
// recKey, encoded as encoding.EncodeRecord(r); key's lock is held or r was
// read under it.
func (c *Cache) Put(key, recKey []byte, epoch uint64, r *encoding.Record) {
	if c == nil || r.State == encoding.StatePending {
		return
	}
	c.PutEncoded(key, recKey, epoch, r, encoding.EncodeRecord(r))
}

// PutEncoded is Put for a record whose encoding the caller already has
// (enc = encoding.EncodeRecord(r), as written to the engine). If the entry
// holds the bytes (Entry.Val), it keeps enc itself: the caller must not
// modify enc after.
func (c *Cache) PutEncoded(key, recKey []byte, epoch uint64, r *encoding.Record, enc []byte) {
	if c == nil || r.State == encoding.StatePending {
		return
	}
	l, err := encoding.RecordLayout(enc)
	if err != nil {
		return // cannot happen for an encoding of ours; cache nothing
	}
	crc, _ := encoding.Checksum(enc)
	set, h := c.set(key)
	rk := make([]byte, len(recKey)+len(key))
	copy(rk[copy(rk, recKey):], key)
	it := &item{h: h, keys: rk, Entry: Entry{
		Layout: l, Key: rk[:len(recKey):len(recKey)], Epoch: epoch, Len: uint32(len(enc)), CRC: crc,
		State: r.State, Attempts: r.Attempts, Token: r.Token,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, LeaseExpiresAt: r.LeaseExpiresAt,
		Trace: bytes.Clone(r.Trace),
	}}
	if n := int64(len(enc)); n <= c.maxVal {
		if c.valBytes.Add(n) <= c.valCap {
			it.Val = enc[:len(enc):len(enc)]
		} else {
			c.valBytes.Add(-n)
		}
	}
	// The way of the same key, else an empty way, else the way whose
	// record was written longest ago.
	var olds [ways]*item
	for w := range set {
		olds[w] = set[w].p.Load()
	}
	victim := slices.IndexFunc(olds[:], func(old *item) bool { return old != nil && old.is(key, h) })
	if victim < 0 {
		victim = slices.Index(olds[:], nil)
	}
	if victim < 0 {
		victim = 0
		for w, old := range olds {
			if old.UpdatedAt < olds[victim].UpdatedAt {
				victim = w
			}
		}
	}
	c.release(set[victim].p.Swap(it))
	set[victim].tag.Store(h)
}

// release accounts for it (nil: nothing), no longer in the table.
func (c *Cache) release(it *item) {
	if it != nil && it.Val != nil {
		c.valBytes.Add(-int64(len(it.Val)))
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
	// Every way, not only those whose tag is key's: the tag is only a
	// filter, and racing Puts of other keys may leave a way's tag stale
	// (the item's own hash never is).
	for w := range set {
		if it := set[w].p.Load(); it != nil && it.is(key, h) && set[w].p.CompareAndSwap(it, nil) {
			c.release(it)
		}
	}
}

// Sweep drops the entries for which expired(UpdatedAt) is true.
func (c *Cache) Sweep(expired func(updatedAt int64) bool) (dropped int) {
	if c == nil {
		return 0
	}
	for i := range c.slots {
		if it := c.slots[i].p.Load(); it != nil && expired(it.UpdatedAt) && c.slots[i].p.CompareAndSwap(it, nil) {
			c.release(it)
			dropped++
		}
	}
	return dropped
}

// Len returns the number of entries and about the bytes they take.
func (c *Cache) Len() (entries int, bytes int64) {
	if c == nil {
		return 0, 0
	}
	bytes = int64(len(c.slots)) * 16
	for i := range c.slots {
		if it := c.slots[i].p.Load(); it != nil {
			entries++
			bytes += entryBytes + int64(len(it.keys)) + int64(len(it.Val))
		}
	}
	return entries, bytes
}
