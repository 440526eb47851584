// Package locktable serializes read-check-write of one key inside a process.
//
// The table is sharded by a hash of the key; each shard's mutex guards only
// its map and reference counts and is never held while waiting or doing I/O.
// Every key gets its own entry, so different keys never wait on each other.
// The per-key lock is a one-slot channel, so acquiring it honours a context,
// and it may be held across I/O (a sync) by design.
package locktable

import (
	"context"
	"hash/maphash"
	"sync"
	"unsafe"

	"github.com/receiptstore/receipts/internal/mutate"
)

const shards = 64

// Table is a set of per-key locks. The zero value is not usable; use New.
type Table struct {
	seed   maphash.Seed
	shards [shards]shard
	free   sync.Pool // of *Entry with refs == 0, ready for reuse
}

type shard struct {
	mu sync.Mutex // protects m and every entry's refs
	m  map[string]*Entry
}

// Entry is one key's lock and its change notification.
type Entry struct {
	t *Table
	// key is the entry's key in sh.m: a string over kbuf, which is not
	// written while the entry is in the map (an entry is reused only once
	// unref has deleted it). Both protected by sh.mu while in use.
	key  string
	kbuf []byte
	sh   *shard
	refs int           // protected by sh.mu
	sem  chan struct{} // one slot: the key lock
	// changed, if not nil, is closed at the next change that waiters care
	// about (Notify), which leaves it nil; Watch makes it. So a change
	// nobody watches makes no channel. Protected by sh.mu.
	changed chan struct{}
}

// New returns an empty table.
func New() *Table {
	t := &Table{seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].m = make(map[string]*Entry)
	}
	return t
}

// ref finds or creates key's entry and takes a reference. Looking up an
// existing entry does not allocate, and neither does creating one from the
// free pool for a key no longer than the ones it held before.
func (t *Table) ref(key []byte) *Entry {
	sh := &t.shards[maphash.Bytes(t.seed, key)%shards]
	sh.mu.Lock()
	e, ok := sh.m[string(key)]
	if !ok {
		e, _ = t.free.Get().(*Entry)
		if e == nil {
			e = &Entry{t: t, sem: make(chan struct{}, 1)}
		}
		e.kbuf = append(e.kbuf[:0], key...)
		e.key, e.sh = unsafe.String(unsafe.SliceData(e.kbuf), len(e.kbuf)), sh
		sh.m[e.key] = e
	}
	e.refs++
	sh.mu.Unlock()
	return e
}

func (e *Entry) unref() {
	sh := e.sh
	sh.mu.Lock()
	e.refs--
	free := e.refs == 0
	if free {
		delete(sh.m, e.key)
		e.key, e.sh = "", nil
	}
	sh.mu.Unlock()
	if free {
		e.t.free.Put(e) // nobody holds a reference: its lock is free
	}
}

// Lock acquires key's lock, or returns ctx's error. The table keeps no
// reference to key.
func (t *Table) Lock(ctx context.Context, key []byte) (*Entry, error) {
	e := t.ref(key)
	if mutate.Name == mutate.NoLock {
		return e, nil
	}
	select {
	case e.sem <- struct{}{}:
		return e, nil
	default:
	}
	select {
	case e.sem <- struct{}{}:
		return e, nil
	case <-ctx.Done():
		e.unref()
		return nil, ctx.Err()
	}
}

// Unlock releases the key lock.
func (e *Entry) Unlock() {
	if mutate.Name != mutate.NoLock {
		<-e.sem
	}
	e.unref()
}

// Notify wakes every watcher of the key. REQUIRES: the key lock held.
func (e *Entry) Notify() {
	e.sh.mu.Lock()
	if e.changed != nil {
		close(e.changed)
		e.changed = nil
	}
	e.sh.mu.Unlock()
}

// Watch returns a channel closed at key's next Notify, without taking the
// key lock, and keeps key's entry alive until Done. A caller that reads
// the key's state after Watch returns misses no change: a change after
// that read notifies the channel.
func (t *Table) Watch(key []byte) Watch {
	e := t.ref(key)
	e.sh.mu.Lock()
	if e.changed == nil {
		e.changed = make(chan struct{})
	}
	w := Watch{C: e.changed, e: e}
	e.sh.mu.Unlock()
	return w
}

// Watch is a pending wake-up; call Done when no longer waiting.
type Watch struct {
	C <-chan struct{}
	e *Entry
}

// Done releases the watch.
func (w Watch) Done() { w.e.unref() }

// Keys returns the keys that start with prefix and have an entry: locked, waited for, or
// watched. A key locked after Keys returns is not listed.
func (t *Table) Keys(prefix []byte) [][]byte {
	var out [][]byte
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k := range sh.m {
			if len(k) >= len(prefix) && k[:len(prefix)] == string(prefix) {
				out = append(out, []byte(k))
			}
		}
		sh.mu.Unlock()
	}
	return out
}

// NotifyAll wakes every watcher of a key that starts with prefix, as Notify does, without
// the keys' locks: for a change made to all of them at once (a scope's erasure).
func (t *Table) NotifyAll(prefix []byte) {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for k, e := range sh.m {
			if e.changed != nil && len(k) >= len(prefix) && k[:len(prefix)] == string(prefix) {
				close(e.changed)
				e.changed = nil
			}
		}
		sh.mu.Unlock()
	}
}

// Len is the number of live entries (for tests).
func (t *Table) Len() int {
	n := 0
	for i := range t.shards {
		t.shards[i].mu.Lock()
		n += len(t.shards[i].m)
		t.shards[i].mu.Unlock()
	}
	return n
}
