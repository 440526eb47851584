package intents

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts/internal/locktable"
	"github.com/receiptstore/receipts/internal/pebbleengine"
)

// The Pebble store's keys. Every action has its record under 'a', an
// entry in the index of its state under 's', and, with a Ref, the Ref's
// entry under 'r'; a batch writes them together.
const (
	prefixAction = 'a' // 'a' key → record
	prefixState  = 's' // 's' state key → nothing
	prefixRef    = 'r' // 'r' ref → key
)

// formatKey holds the journal's format version.
var formatKey = []byte("m\x00format")

// journalFormat is the format this version writes and reads.
const journalFormat = 1

// Open opens the journal in dir, an embedded Pebble database, creating it
// if needed. The directory is the host's own: do not share it with a
// receipts store. It fails with ErrLocked when another process (or
// another Journal in this process) holds dir.
func Open(dir string, opts *Options) (*Journal, error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	s, err := openPebble(dir, &o)
	if err != nil {
		return nil, err
	}
	return New(s, &o)
}

// OpenPebble opens the Pebble store in dir, for New: Open(dir, opts) is
// New(OpenPebble(dir, opts), opts). Only opts.Pebble and opts.Logger
// apply to the store.
func OpenPebble(dir string, opts *Options) (Store, error) {
	o, err := opts.resolve()
	if err != nil {
		return nil, err
	}
	return openPebble(dir, &o)
}

// pebbleStore is the Pebble Store.
type pebbleStore struct {
	db    *pebble.DB
	lock  *pebble.Lock
	keys  *locktable.Table // one writer (and reader) per action key
	refs  *locktable.Table // one Create per Ref
	wsync *pebble.WriteOptions
}

func openPebble(dir string, o *Options) (*pebbleStore, error) {
	var po *pebble.Options
	if o.Pebble != nil {
		po = o.Pebble.Clone()
	} else {
		po = &pebble.Options{}
	}
	if po.FS == nil {
		po.FS = vfs.Default
	}
	if po.Logger != nil || po.LoggerAndTracer == nil {
		po.Logger = pebbleengine.Logger(po.Logger, o.Logger)
	}
	po.EnsureDefaults()
	if err := po.FS.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("intents: create %s: %w", dir, err)
	}
	lock, err := pebble.LockDirectory(dir, po.FS)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrLocked, dir, err)
	}
	po.Lock = lock
	db, err := pebble.Open(dir, po)
	if err != nil {
		_ = lock.Close()
		return nil, fmt.Errorf("intents: open %s: %w", dir, err)
	}
	s := &pebbleStore{db: db, lock: lock, keys: locktable.New(), refs: locktable.New(), wsync: pebble.Sync}
	if err := s.checkFormat(); err != nil {
		_ = s.Close()
		return nil, err
	}
	return s, nil
}

// checkFormat writes the format of a new journal, or checks an old one's.
func (s *pebbleStore) checkFormat() error {
	v, closer, err := s.db.Get(formatKey)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		if err := s.db.Set(formatKey, []byte{journalFormat}, pebble.Sync); err != nil {
			return fmt.Errorf("intents: write format: %w", err)
		}
		return nil
	case err != nil:
		return fmt.Errorf("intents: read format: %w", err)
	}
	defer closer.Close()
	if len(v) != 1 || v[0] != journalFormat {
		return fmt.Errorf("%w: format %x (this version reads %d)", ErrUnknownFormat, v, journalFormat)
	}
	return nil
}

func (s *pebbleStore) Close() error {
	err := s.db.Close()
	if lerr := s.lock.Close(); err == nil {
		err = lerr
	}
	return err
}

func actionKey(key string) []byte { return append([]byte{prefixAction}, key...) }
func refKey(ref string) []byte    { return append([]byte{prefixRef}, ref...) }
func stateKey(st State, key string) []byte {
	return append([]byte{prefixState, byte(st)}, key...)
}

// get reads the action key; the caller holds its lock (or knows that no
// write of it can be in flight).
func (s *pebbleStore) get(key string) (*Action, error) {
	v, closer, err := s.db.Get(actionKey(key))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, key)
	}
	if err != nil {
		return nil, fmt.Errorf("intents: read %s: %w", key, err)
	}
	defer closer.Close()
	a, err := decodeAction(v)
	if err != nil {
		return nil, fmt.Errorf("action %s: %w", key, err)
	}
	if a.Key != key {
		return nil, fmt.Errorf("%w: record of %s holds %s", ErrCorrupt, key, a.Key)
	}
	return a, nil
}

func (s *pebbleStore) Create(ctx context.Context, a *Action) (*Action, bool, error) {
	if a.Ref != "" {
		e, err := s.refs.Lock(ctx, []byte(a.Ref))
		if err != nil {
			return nil, false, err
		}
		defer e.Unlock()
		v, closer, err := s.db.Get(refKey(a.Ref))
		switch {
		case err == nil:
			key := string(v)
			closer.Close()
			stored, err := s.Get(ctx, key)
			if err == nil {
				return stored, false, nil
			}
			if !errors.Is(err, ErrNotFound) {
				return nil, false, err
			}
			// The action was forgotten as this Create read its Ref: the
			// Ref is free.
		case !errors.Is(err, pebble.ErrNotFound):
			return nil, false, fmt.Errorf("intents: read ref: %w", err)
		}
	}
	// The key is new: only this call knows it. Its lock keeps readers off
	// the record until it is synced.
	e, err := s.keys.Lock(ctx, []byte(a.Key))
	if err != nil {
		return nil, false, err
	}
	defer e.Unlock()
	if _, closer, err := s.db.Get(actionKey(a.Key)); err == nil {
		closer.Close()
		return nil, false, fmt.Errorf("intents: key %s is taken", a.Key) // a UUIDv7 collision: never
	}
	rec, err := encodeAction(a)
	if err != nil {
		return nil, false, err
	}
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.Set(actionKey(a.Key), rec, nil)
	_ = b.Set(stateKey(a.State, a.Key), nil, nil)
	if a.Ref != "" {
		_ = b.Set(refKey(a.Ref), []byte(a.Key), nil)
	}
	if err := b.Commit(s.wsync); err != nil {
		return nil, false, fmt.Errorf("intents: write %s: %w", a.Key, err)
	}
	return a.clone(), true, nil
}

func (s *pebbleStore) Update(ctx context.Context, key string, from []State, sync bool, change func(*Action) error) (*Action, error) {
	e, err := s.keys.Lock(ctx, []byte(key))
	if err != nil {
		return nil, err
	}
	defer e.Unlock()
	old, err := s.get(key)
	if err != nil {
		return nil, err
	}
	if !StateIn(old.State, from) {
		return nil, fmt.Errorf("%w: %s is %v", ErrWrongState, key, old.State)
	}
	a := old.clone()
	if err := change(a); err != nil {
		return nil, err
	}
	if a.Key != old.Key || a.Ref != old.Ref || a.State < Approved || a.State > Uncertain {
		return nil, fmt.Errorf("intents: change of %s made an invalid action", key)
	}
	rec, err := encodeAction(a)
	if err != nil {
		return nil, err
	}
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.Set(actionKey(key), rec, nil)
	if a.State != old.State {
		_ = b.Delete(stateKey(old.State, key), nil)
		_ = b.Set(stateKey(a.State, key), nil, nil)
	}
	wo := pebble.NoSync
	if sync {
		wo = s.wsync
	}
	if err := b.Commit(wo); err != nil {
		return nil, fmt.Errorf("intents: write %s: %w", key, err)
	}
	return a.clone(), nil
}

func (s *pebbleStore) Get(ctx context.Context, key string) (*Action, error) {
	e, err := s.keys.Lock(ctx, []byte(key))
	if err != nil {
		return nil, err
	}
	defer e.Unlock()
	return s.get(key)
}

func (s *pebbleStore) List(ctx context.Context, state State) iter.Seq2[*Action, error] {
	return func(yield func(*Action, error) bool) {
		var lo []byte
		if state == 0 {
			lo = []byte{prefixAction}
		} else {
			lo = []byte{prefixState, byte(state)}
		}
		hi := append(bytes.Clone(lo[:len(lo)-1]), lo[len(lo)-1]+1)
		it, err := s.db.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: lo, UpperBound: hi})
		if err != nil {
			yield(nil, fmt.Errorf("intents: list: %w", err))
			return
		}
		defer it.Close()
		for ok := it.First(); ok; ok = it.Next() {
			if err := ctx.Err(); err != nil {
				yield(nil, err)
				return
			}
			key := string(it.Key()[len(lo):])
			// Read it again under its lock: the iterator can see a write
			// whose sync has not returned yet.
			a, err := s.Get(ctx, key)
			if errors.Is(err, ErrNotFound) {
				continue // forgotten meanwhile
			}
			if err != nil {
				yield(nil, err)
				return
			}
			if state != 0 && a.State != state {
				continue // moved on meanwhile
			}
			if !yield(a, nil) {
				return
			}
		}
		if err := it.Error(); err != nil {
			yield(nil, fmt.Errorf("intents: list: %w", err))
		}
	}
}

func (s *pebbleStore) Delete(ctx context.Context, key string, from []State) error {
	e, err := s.keys.Lock(ctx, []byte(key))
	if err != nil {
		return err
	}
	defer e.Unlock()
	old, err := s.get(key)
	if err != nil {
		return err
	}
	if !StateIn(old.State, from) {
		return fmt.Errorf("%w: %s is %v", ErrWrongState, key, old.State)
	}
	b := s.db.NewBatch()
	defer b.Close()
	_ = b.Delete(actionKey(key), nil)
	_ = b.Delete(stateKey(old.State, key), nil)
	if old.Ref != "" {
		_ = b.Delete(refKey(old.Ref), nil)
	}
	if err := b.Commit(s.wsync); err != nil {
		return fmt.Errorf("intents: delete %s: %w", key, err)
	}
	return nil
}
