package engine

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/bench/internal/stores"
	"github.com/receiptstore/receipts/bench/internal/workload"
	"github.com/receiptstore/receipts/pgstore"
)

// PGStore is receipts on PostgreSQL (pgstore) behind the stores.Store interface.
type PGStore struct {
	DB *receipts.DB
	// Tx: first calls and retries go through pgstore.DoTx (claim, effect and receipt in
	// one transaction; fn writes one effect row, as pg-tx-floor does); otherwise through DB.Do (a claim and a commit, two flushes).
	Tx bool
	// LookupReplay: Replay reads with DB.Lookup (pgstore's plain MVCC read) instead of
	// DB.Do. Not a path callers take for a retry: it measures what a lookup-first claim
	// would pay for a replay.
	LookupReplay bool
	// Firsts counts operations whose fn ran.
	Firsts atomic.Uint64
	// Label, if set, is the row label (Name).
	Label string

	effects string // Tx: the table fn writes its effect row to (quoted)
}

// retention is the PostgreSQL benchmarks' Retention (PGOptions).
const retention = time.Hour

// PGOptions are the options PostgreSQL benchmarks open pgstore with: a 1h retention,
// background GC off, poll-only (no LISTEN session: nothing waits across nodes here),
// quiet logging. now may be nil (the database's clock).
func PGOptions(schema string, now func() time.Time) *pgstore.Options {
	return &pgstore.Options{
		Options: receipts.Options{
			Retention:  retention,
			LeaseTTL:   30 * time.Second,
			GCInterval: -1,
			Now:        now,
			Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		},
		Schema: schema,
	}
}

// OpenPG opens (creating) a pgstore store in schema of pool's database, dropping what an
// earlier run left there first. The pool stays the caller's.
func OpenPG(ctx context.Context, pool *pgxpool.Pool, schema string, tx bool) (*PGStore, error) {
	return OpenPGWith(ctx, pool, schema, tx, nil)
}

// OpenPGWith is OpenPG with the options changed by mod (nil: none).
func OpenPGWith(ctx context.Context, pool *pgxpool.Pool, schema string, tx bool, mod func(*pgstore.Options)) (*PGStore, error) {
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return nil, err
	}
	o := PGOptions(schema, nil)
	if mod != nil {
		mod(o)
	}
	db, err := pgstore.Open(ctx, pool, o)
	if err != nil {
		return nil, err
	}
	s := &PGStore{DB: db, Tx: tx}
	if tx { // fn writes the caller's effect row in DoTx's transaction, as pg-tx-floor does
		s.effects = pgx.Identifier{schema, "effects"}.Sanitize()
		if _, err := pool.Exec(ctx, "CREATE TABLE "+s.effects+" ("+stores.EffectColumns+")"); err != nil {
			_ = db.Close()
			return nil, err
		}
	}
	return s, nil
}

// OpenPGAged opens receipts-pg's store in schema after aging it the way a store that has run
// for Retention + TombstoneWindow is aged: from that long before the database's time to an
// epoch before it, an epoch at a time on an injected clock, perEpoch receipts are written
// and GC runs (it creates the partitions ahead, and drops the records partitions past
// retention after writing their records' tombstone markers). The schema then holds a records
// partition with receipts for every live epoch and the markers partitions in force with
// markers, where a store younger than its retention (receipts-pg) holds the current records
// partition, two ahead and one markers partition: a first claim's probe covers more
// partitions (docs/performance.md, "Anatomy of a first call on PostgreSQL"). The store is
// then reopened on the database's clock, as OpenPG's.
func OpenPGAged(ctx context.Context, pool *pgxpool.Pool, schema string, perEpoch int) (*PGStore, error) {
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
		return nil, err
	}
	var dbNow time.Time
	if err := pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&dbNow); err != nil {
		return nil, err
	}
	// the clock starts a retention earlier than the store needs to have run: whatever the
	// epoch width, the oldest epochs then hold only what GC has dropped
	var mu sync.Mutex
	now := dbNow.Add(-2*retention - receipts.DefaultTombstoneWindow(retention))
	o := PGOptions(schema, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	set := func(t time.Time) { mu.Lock(); now = t; mu.Unlock() }
	db, err := pgstore.Open(ctx, pool, o)
	if err != nil {
		return nil, err
	}
	width := db.Options().EpochWidth // the one in force
	fn := func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("aged result"), nil }
	for t := o.Now(); t.Before(dbNow.Add(-width)); t = t.Add(width) {
		set(t)
		for i := range perEpoch {
			k := receipts.Key{Scope: "aged", ID: fmt.Sprintf("%d/%d", t.UnixMicro(), i)}
			if _, err := db.Do(ctx, k, []byte("fp"), fn); err != nil {
				_ = db.Close()
				return nil, fmt.Errorf("age the store: %w", err)
			}
		}
		if _, err := db.GC(ctx); err != nil {
			_ = db.Close()
			return nil, fmt.Errorf("age the store: GC: %w", err)
		}
	}
	if err := db.Close(); err != nil {
		return nil, err
	}
	if db, err = pgstore.Open(ctx, pool, PGOptions(schema, nil)); err != nil {
		return nil, err
	}
	return &PGStore{DB: db, Label: "receipts-pg-aged"}, nil
}

// Name is the row label in reports.
func (s *PGStore) Name() string {
	if s.Label != "" {
		return s.Label
	}
	if s.LookupReplay {
		return "receipts-pg-lookup"
	}
	if s.Tx {
		return "receipts-pg-tx"
	}
	return "receipts-pg"
}

// Close closes the DB (not the pool).
func (s *PGStore) Close() error { return s.DB.Close() }

// Do performs k once.
func (s *PGStore) Do(ctx context.Context, k workload.Key, fp, result []byte) (bool, error) {
	key := receipts.Key{Scope: k.Scope, ID: k.ID}
	ran := false
	var err error
	if s.Tx {
		_, err = pgstore.DoTx(ctx, s.DB, key, fp, func(ctx context.Context, tx pgx.Tx, _ *receipts.Lease) ([]byte, error) {
			ran = true
			s.Firsts.Add(1)
			if _, err := tx.Exec(ctx, "INSERT INTO "+s.effects+" (scope, id, payload) VALUES ($1, $2, $3)", k.Scope, k.ID, result); err != nil {
				return nil, err
			}
			return result, nil
		})
	} else {
		_, err = s.DB.Do(ctx, key, fp, func(context.Context, *receipts.Lease) ([]byte, error) {
			ran = true
			s.Firsts.Add(1)
			return result, nil
		})
	}
	return !ran, err
}

// Replay answers a retry of the committed key k through the same call as Do.
func (s *PGStore) Replay(ctx context.Context, k workload.Key, fp []byte) error {
	key := receipts.Key{Scope: k.Scope, ID: k.ID}
	var r *receipts.Receipt
	var err error
	switch {
	case s.LookupReplay:
		r, err = s.DB.Lookup(ctx, key)
		if err == nil && !bytes.Equal(r.Fingerprint, fp) {
			return stores.ErrMismatch
		}
	case s.Tx:
		r, err = pgstore.DoTx(ctx, s.DB, key, fp, func(context.Context, pgx.Tx, *receipts.Lease) ([]byte, error) {
			return nil, receipts.NotPerformed(errReplayRan)
		})
	default:
		r, err = s.DB.Do(ctx, key, fp, func(context.Context, *receipts.Lease) ([]byte, error) {
			return nil, receipts.NotPerformed(errReplayRan)
		})
	}
	if err != nil {
		return err
	}
	if r.State != receipts.Succeeded {
		return stores.ErrNotCommitted
	}
	return nil
}
