// Package stores holds the baselines that receipts is measured against: the raw Pebble
// floor (the least any correct store must do on this engine) and the stores users would
// otherwise pick for idempotency keys (bbolt, SQLite, PostgreSQL). Each does the same
// work per operation: look the key up, write a durable claim, run nothing (the effect is
// outside the measurement), write a durable commit holding the result; a retry of a
// committed key reads the stored result back.
package stores

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"hash/maphash"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/bench/internal/workload"
)

// Store is one way to make a retried operation happen once.
type Store interface {
	// Name is the row label in reports.
	Name() string
	// Do performs the first call of k: it checks that k is absent, writes a durable claim
	// and then a durable commit holding result. If k is already committed it returns its
	// stored result instead, with replayed set.
	Do(ctx context.Context, k workload.Key, fp, result []byte) (replayed bool, err error)
	// Replay answers a retry of the committed key k.
	Replay(ctx context.Context, k workload.Key, fp []byte) error
	Close() error
}

// Settler is a store that can bring its files to a settled shape: memtables flushed and
// everything compacted, with no background work left. Reads then go where a loaded
// server's reads of anything but its last fraction of a second go, and two stores being
// compared are in the same state, neither of them compacting while the other is measured.
type Settler interface {
	Settle() error
}

// SettlePebble flushes db and compacts its whole key space.
func SettlePebble(db *pebble.DB) error {
	if err := db.Flush(); err != nil {
		return err
	}
	return db.Compact(context.Background(), []byte{0}, bytes.Repeat([]byte{0xff}, 16), true)
}

var (
	// ErrInProgress: the key is claimed and not committed yet.
	ErrInProgress = errors.New("stores: in progress")
	// ErrMismatch: the key was used with another fingerprint.
	ErrMismatch = errors.New("stores: fingerprint mismatch")
	// ErrNotCommitted: Replay found no committed receipt.
	ErrNotCommitted = errors.New("stores: no committed receipt")
)

// Record states, as stored by the floor, bbolt and SQLite.
const (
	statePending   = 1
	stateSucceeded = 2
)

// recordHeader is the fixed part of a record: state(1) fingerprint(32) token(8)
// created(8) updated(8) lease expiry(8), what the engine keeps besides the result.
const recordHeader = 1 + 32 + 8 + 8 + 8 + 8

// encodeRecord builds a record of the given state. It costs what an encoder of a small
// fixed struct must cost: one allocation of the final size.
func encodeRecord(state byte, fp, result []byte, token uint64, now time.Time) []byte {
	b := make([]byte, recordHeader, recordHeader+len(result))
	b[0] = state
	copy(b[1:33], fp)
	binary.BigEndian.PutUint64(b[33:], token)
	ns := uint64(now.UnixNano())
	binary.BigEndian.PutUint64(b[41:], ns)
	binary.BigEndian.PutUint64(b[49:], ns)
	binary.BigEndian.PutUint64(b[57:], ns+uint64(30*time.Second))
	return append(b, result...)
}

// checkRecord decides what a found record means for a caller with fingerprint fp.
func checkRecord(v, fp []byte) error {
	if len(v) < recordHeader {
		return errors.New("stores: short record")
	}
	if !bytes.Equal(v[1:33], fp) {
		return ErrMismatch
	}
	if v[0] != stateSucceeded {
		return ErrInProgress
	}
	return nil
}

// recordKey lays a key out like the engine does: tag, epoch, len(scope), scope, id.
func recordKey(k workload.Key, epoch uint32) []byte {
	b := make([]byte, 0, 1+4+1+len(k.Scope)+len(k.ID))
	b = append(b, 'r')
	b = binary.BigEndian.AppendUint32(b, epoch)
	b = append(b, byte(len(k.Scope)))
	b = append(b, k.Scope...)
	return append(b, k.ID...)
}

// stripes is a striped lock table: it serializes the read-check-write of one key, like
// the engine's. It is what makes the floor correct for concurrent calls on one key; for
// distinct keys it costs an uncontended mutex.
type stripes struct {
	seed maphash.Seed
	mu   [256]sync.Mutex
}

func newStripes() *stripes { return &stripes{seed: maphash.MakeSeed()} }

func (s *stripes) lock(k workload.Key) *sync.Mutex {
	var h maphash.Hash
	h.SetSeed(s.seed)
	h.WriteString(k.Scope)
	h.WriteByte(0)
	h.WriteString(k.ID)
	m := &s.mu[h.Sum64()%uint64(len(s.mu))]
	m.Lock()
	return m
}
