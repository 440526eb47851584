// Package engine adapts receipts.DB to the stores.Store interface, so the engine runs
// through the same workloads as the floor and the peers.
package engine

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/bench/internal/stores"
	"github.com/receiptstore/receipts/bench/internal/workload"
	"github.com/receiptstore/receipts/internal/peek"
	"github.com/receiptstore/receipts/pebblestore"
)

// Mode is the API path an operation takes.
type Mode int

const (
	// ModeDo: DB.Do (what most users call); replays through Do as well.
	ModeDo Mode = iota
	// ModeClaimCommit: DB.Claim then Lease.Commit; replays through Claim.
	ModeClaimCommit
	// ModeCommitWith: DB.Claim then Lease.CommitWith with a small effect.
	ModeCommitWith
	// ModeDoBatch: DB.DoBatch with a small effect (unsynced claim, one fsync).
	ModeDoBatch
)

// Store is receipts behind the stores.Store interface.
type Store struct {
	DB   *receipts.DB
	Mode Mode
	// Firsts counts operations whose fn (or lease) ran: first calls, not replays.
	Firsts atomic.Uint64
	// Label, if set, is the row label (Name).
	Label string
	// AfterClose, if set, runs after Close has closed the DB (an observer's shutdown).
	AfterClose func()
}

// Options returns the engine options benchmarks use: Pebble on disk with the same
// options as the floor, background GC off (GC is measured on its own), quiet logging.
// now may be nil (wall clock).
func Options(now func() time.Time) *pebblestore.Options {
	return &pebblestore.Options{
		Options: receipts.Options{
			Retention:  time.Hour,
			LeaseTTL:   30 * time.Second,
			GCInterval: -1,
			Now:        now,
			Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		},
		Pebble: stores.PebbleOptions(),
	}
}

// Open opens (creating) an engine store in dir; opts nil means Options(nil).
func Open(dir string, opts *pebblestore.Options, mode Mode) (*Store, error) {
	if opts == nil {
		opts = Options(nil)
	}
	db, err := pebblestore.Open(dir, opts)
	if err != nil {
		return nil, err
	}
	return &Store{DB: db, Mode: mode}, nil
}

// Name is the row label in reports.
func (s *Store) Name() string {
	if s.Label != "" {
		return s.Label
	}
	return "receipts"
}

// Close closes the engine.
func (s *Store) Close() error {
	err := s.DB.Close()
	if s.AfterClose != nil {
		s.AfterClose()
	}
	return err
}

// Settle flushes the engine's memtables and compacts everything. It takes
// the Pebble database through internal/peek, not DB.Pebble, which would
// turn off the replay cache's answers from memory for the rest of the run
// (a flush and a compaction change no record).
func (s *Store) Settle() error { return stores.SettlePebble(peek.Pebble(s.DB)) }

var errReplayRan = errors.New("engine: fn ran for a committed key")

// Do performs k once through the store's Mode.
func (s *Store) Do(ctx context.Context, k workload.Key, fp, result []byte) (bool, error) {
	key := receipts.Key{Scope: k.Scope, ID: k.ID}
	switch s.Mode {
	case ModeClaimCommit, ModeCommitWith:
		l, r, err := s.DB.Claim(ctx, key, fp, receipts.WaitForResult())
		if err != nil {
			return false, err
		}
		if r != nil {
			return true, nil
		}
		s.Firsts.Add(1)
		if s.Mode == ModeClaimCommit {
			_, err = l.Commit(ctx, result)
			return false, err
		}
		ek, ev := workload.Effect(k)
		_, err = pebblestore.CommitWith(ctx, l, result, func(b *pebble.Batch) error { return b.Set(ek, ev, nil) })
		return false, err
	case ModeDoBatch:
		ran := false
		_, err := pebblestore.DoBatch(ctx, s.DB, key, fp, func(_ context.Context, _ *receipts.Lease, b *pebble.Batch) ([]byte, error) {
			ran = true
			s.Firsts.Add(1)
			ek, ev := workload.Effect(k)
			return result, b.Set(ek, ev, nil)
		})
		return !ran, err
	default:
		ran := false
		_, err := s.DB.Do(ctx, key, fp, func(context.Context, *receipts.Lease) ([]byte, error) {
			ran = true
			s.Firsts.Add(1)
			return result, nil
		})
		return !ran, err
	}
}

// Replay answers a retry of the committed key k, through Claim in the Claim modes and
// through Do otherwise.
func (s *Store) Replay(ctx context.Context, k workload.Key, fp []byte) error {
	key := receipts.Key{Scope: k.Scope, ID: k.ID}
	switch s.Mode {
	case ModeClaimCommit, ModeCommitWith:
		l, r, err := s.DB.Claim(ctx, key, fp)
		if err != nil {
			return err
		}
		if l != nil || r.State != receipts.Succeeded {
			return stores.ErrNotCommitted
		}
		return nil
	default:
		r, err := s.DB.Do(ctx, key, fp, func(context.Context, *receipts.Lease) ([]byte, error) {
			return nil, receipts.NotPerformed(errReplayRan)
		})
		if err != nil {
			return err
		}
		if r.State != receipts.Succeeded {
			return stores.ErrNotCommitted
		}
		return nil
	}
}
