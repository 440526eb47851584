package pebbleengine

import (
	"hash/maphash"
	"sync"
	"unsafe"

	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/machine"
	"github.com/receiptstore/receipts/internal/mutate"
)

// pendingMemo remembers, for a key whose last write by the engine stored a
// Pending record (a claim, a renewal, a takeover), that record's engine key
// and its bytes, so that the next read-check-write of the key (the claim's
// commit or failure, most often) decides from them instead of reading
// Pebble again.
//
// Why the bytes are the engine's: every write of a record goes through rmw,
// which deletes the key's memo entry under the key lock before it writes,
// and puts one only after the write of a Pending record succeeded, still
// under the lock. So an entry found under the key lock holds exactly what
// the key's last write put in Pebble (in its memtable, durable or not: a
// restart starts with no entries), and nothing newer can be stored under
// another epoch. GC drops whole epochs, and only records past retention:
// an entry is used only while its record is visible and its epoch live.
// Writes by anyone else need the raw Pebble handle, whose handing out
// (Engine.DB) turns the memo off, as it does the replay cache's memory
// answers.
//
// It is bounded: memoShards × memoPerShard entries, each a Pending record
// (no result) and its key. A lease that is never finished leaves its entry
// until the shard needs the room; an evicted entry only costs its key's next
// write the read.
type pendingMemo struct {
	seed   maphash.Seed
	shards [memoShards]memoShard
}

const (
	memoShards   = 64
	memoPerShard = 256
)

type memoShard struct {
	mu sync.Mutex
	m  map[string]memoEntry
}

// memoEntry is a record as written: its engine key (with its epoch) and its
// bytes, both owned by the memo and never modified (one allocation with the
// entry's map key).
type memoEntry struct {
	key   []byte
	epoch uint64
	enc   []byte
}

func newPendingMemo() *pendingMemo {
	m := &pendingMemo{seed: maphash.MakeSeed()}
	for i := range m.shards {
		m.shards[i].m = make(map[string]memoEntry)
	}
	return m
}

func (m *pendingMemo) shard(lockKey []byte) *memoShard {
	return &m.shards[maphash.Bytes(m.seed, lockKey)%memoShards]
}

func (m *pendingMemo) get(lockKey []byte) (memoEntry, bool) {
	sh := m.shard(lockKey)
	sh.mu.Lock()
	ent, ok := sh.m[string(lockKey)]
	sh.mu.Unlock()
	return ent, ok
}

// put remembers key and enc as lockKey's record, in a copy of its own: one
// allocation holds lockKey (the map's key), key and enc.
//
// REQUIRES: lockKey's lock is held, and the write of enc under key succeeded.
func (m *pendingMemo) put(lockKey, key []byte, epoch uint64, enc []byte) {
	slab := make([]byte, 0, len(lockKey)+len(key)+len(enc))
	slab = append(append(append(slab, lockKey...), key...), enc...)
	nl, nk := len(lockKey), len(lockKey)+len(key)
	mk := unsafe.String(unsafe.SliceData(slab), nl) // never modified: the slab is the memo's
	ent := memoEntry{key: slab[nl:nk:nk], epoch: epoch, enc: slab[nk:len(slab):len(slab)]}
	sh := m.shard(lockKey)
	sh.mu.Lock()
	if _, ok := sh.m[mk]; !ok && len(sh.m) >= memoPerShard {
		for k := range sh.m { // any one: the map's order is as good as any
			delete(sh.m, k)
			break
		}
	}
	sh.m[mk] = ent
	sh.mu.Unlock()
}

// delete forgets lockKey's record.
//
// REQUIRES: lockKey's lock is held.
func (m *pendingMemo) delete(lockKey []byte) {
	sh := m.shard(lockKey)
	sh.mu.Lock()
	delete(sh.m, string(lockKey))
	sh.mu.Unlock()
}

// clear forgets every record (EraseScope): a write that finds no entry reads the record.
func (m *pendingMemo) clear() {
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		clear(sh.m)
		sh.mu.Unlock()
	}
}

// len is the number of entries.
func (m *pendingMemo) len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// readMemo is readInto from the memo: ok is false if the memo cannot
// answer (no entry, an entry whose record is not visible at now or whose
// epoch is not live, the raw handle handed out), and the caller reads
// Pebble. Otherwise found is true, rec holds the record and stored is its
// engine key, in buf.
//
// REQUIRES: lockKey's lock is held.
func (e *Engine) readMemo(lockKey []byte, now int64, rec *encoding.Record, buf []byte) (stored []byte, ok bool) {
	if e.rawDB.Load() && mutate.Name != mutate.MemoRaw {
		return nil, false
	}
	ent, ok := e.memo.get(lockKey)
	if !ok {
		return nil, false
	}
	hi := e.epochOf(now)
	if ent.epoch > hi || ent.epoch < e.oldestLiveEpoch(hi) {
		return nil, false
	}
	// The entry's bytes are never modified, and nothing made from them is
	// written to: rec may alias them (the write that follows encodes a copy).
	if err := encoding.DecodeRecordShared(rec, ent.enc); err != nil {
		return nil, false // cannot happen for bytes the engine encoded; read Pebble
	}
	if rec.UpdatedAt > now || !machine.Visible(rec, now, e.retention) {
		return nil, false // readInto decides the expired cases (tombstones)
	}
	return append(buf[:0], ent.key...), true
}
