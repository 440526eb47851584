package stores

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/receiptstore/receipts/bench/internal/workload"
)

var boltBucket = []byte("receipts")

// Bolt is bbolt with one read-write transaction per step: the claim (look up, then put
// the pending record) and the commit each get their own Update, so each is fsynced before
// it returns. bbolt has one writer at a time; its Batch would merge concurrent Updates but
// changes the meaning of a failed step, so it is not used.
type Bolt struct {
	db     *bolt.DB
	tokens atomic.Uint64
}

// OpenBolt opens (creating) a bbolt file in dir.
func OpenBolt(dir string) (*Bolt, error) {
	db, err := bolt.Open(filepath.Join(dir, "receipts.bolt"), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		return nil, err
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(boltBucket)
		return err
	})
	if err != nil {
		db.Close()
		return nil, err
	}
	return &Bolt{db: db}, nil
}

func (s *Bolt) Name() string { return "bbolt" }
func (s *Bolt) Close() error { return s.db.Close() }

func (s *Bolt) Do(_ context.Context, k workload.Key, fp, result []byte) (bool, error) {
	key := recordKey(k, 0)
	var found bool
	var tok uint64
	now := time.Now()
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(boltBucket)
		if v := b.Get(key); v != nil {
			found = true
			return checkRecord(v, fp)
		}
		tok = s.tokens.Add(1)
		return b.Put(key, encodeRecord(statePending, fp, nil, tok, now))
	})
	if err != nil || found {
		return found && err == nil, err
	}
	return false, s.db.Update(func(tx *bolt.Tx) error {
		return tx.Bucket(boltBucket).Put(key, encodeRecord(stateSucceeded, fp, result, tok, now))
	})
}

func (s *Bolt) Replay(_ context.Context, k workload.Key, fp []byte) error {
	key := recordKey(k, 0)
	return s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(boltBucket).Get(key)
		if v == nil {
			return ErrNotCommitted
		}
		return checkRecord(v, fp)
	})
}
