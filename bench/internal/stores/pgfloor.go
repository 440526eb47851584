package stores

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts/bench/internal/workload"
)

// OpenPGPool connects to dsn with a pool of conns connections, all opened at once, with
// synchronous_commit = on, and checks that the server runs with fsync = on: the durable
// setting every PostgreSQL row of the table is measured with. The PostgreSQL stores of one
// run share it (they run one after the other), so that a 64-way run of each stays under the
// server's connection limit.
func OpenPGPool(ctx context.Context, dsn string, conns int) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	conns = max(conns, 4)
	cfg.MaxConns = int32(conns)
	cfg.MinConns = int32(conns)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	var fsync string
	if err := pool.QueryRow(ctx, `SHOW fsync`).Scan(&fsync); err != nil {
		pool.Close()
		return nil, err
	}
	if fsync != "on" {
		pool.Close()
		return nil, fmt.Errorf("stores: postgres must run with fsync=on (have %s)", fsync)
	}
	return pool, nil
}

// PGFloor is the least a correct claim/commit store must do on PostgreSQL: two plain
// autocommitted statements, each waiting for its WAL flush. The claim is one INSERT .. ON
// CONFLICT DO NOTHING RETURNING (absent check and claim in one round trip; a conflict is
// answered by reading the row), the commit one UPDATE of the claimed row matching its token.
// A retry is one plain SELECT by primary key. No lease expiry, no takeover, no fencing
// across purges, no waiting: it is a floor, not a design.
type PGFloor struct {
	pool *pgxpool.Pool
}

// OpenPGFloor (re)creates the floor's table on pool, which stays the caller's.
func OpenPGFloor(ctx context.Context, pool *pgxpool.Pool) (*PGFloor, error) {
	_, err := pool.Exec(ctx, `DROP TABLE IF EXISTS pg_floor;
CREATE TABLE pg_floor (
	scope      TEXT        NOT NULL,
	id         TEXT        NOT NULL,
	fp         BYTEA       NOT NULL,
	state      SMALLINT    NOT NULL,
	token      BIGINT      NOT NULL,
	result     BYTEA,
	updated_at TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (scope, id)
)`)
	if err != nil {
		return nil, err
	}
	return &PGFloor{pool: pool}, nil
}

// Name is the row label.
func (s *PGFloor) Name() string { return "pg-floor" }

// Close does nothing: the pool is the caller's.
func (s *PGFloor) Close() error { return nil }

func randomToken() int64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return int64(binary.BigEndian.Uint64(b[:]) & math.MaxInt64)
}

// Do claims k with one INSERT and commits it with one UPDATE.
func (s *PGFloor) Do(ctx context.Context, k workload.Key, fp, result []byte) (bool, error) {
	token := randomToken()
	var one int
	err := s.pool.QueryRow(ctx, `INSERT INTO pg_floor (scope, id, fp, state, token, updated_at)
VALUES ($1, $2, $3, 1, $4, now()) ON CONFLICT (scope, id) DO NOTHING RETURNING 1`, k.Scope, k.ID, fp, token).Scan(&one)
	if errors.Is(err, pgx.ErrNoRows) {
		err := s.Replay(ctx, k, fp)
		return err == nil, err
	}
	if err != nil {
		return false, err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE pg_floor SET state = 2, result = $3, updated_at = now()
WHERE scope = $1 AND id = $2 AND token = $4`, k.Scope, k.ID, result, token)
	if err != nil {
		return false, err
	}
	if tag.RowsAffected() != 1 {
		return false, errors.New("stores: pg-floor commit matched no claim")
	}
	return false, nil
}

// Replay reads k with one plain SELECT.
func (s *PGFloor) Replay(ctx context.Context, k workload.Key, fp []byte) error {
	return replaySelect(ctx, s.pool, `SELECT fp, state, result FROM pg_floor WHERE scope = $1 AND id = $2`, k, fp)
}

// replaySelect reads k's record with query (its fingerprint, state and result by scope and
// id: one plain SELECT by primary key) and checks it against fp, as the floors' retries do.
func replaySelect(ctx context.Context, pool *pgxpool.Pool, query string, k workload.Key, fp []byte) error {
	var gotFP, result []byte
	var state int16
	err := pool.QueryRow(ctx, query, k.Scope, k.ID).Scan(&gotFP, &state, &result)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotCommitted
	}
	if err != nil {
		return err
	}
	v := make([]byte, recordHeader)
	v[0] = byte(state)
	copy(v[1:33], gotFP)
	return checkRecord(v, fp)
}

// FGIStyle is how the closest Go peer (faustbrian/go-idempotency's PostgreSQL store) runs
// every transition, replays included: one transaction that takes a transaction-scoped
// advisory lock on the key's digest (an absent key has no row to lock), reads the record
// with SELECT .. FOR UPDATE, decides in Go, upserts the JSONB record and commits. A replay
// therefore takes a row lock, gets a transaction id and waits for a WAL flush.
type FGIStyle struct {
	pool *pgxpool.Pool
}

// OpenFGIStyle (re)creates its table on pool, which stays the caller's.
func OpenFGIStyle(ctx context.Context, pool *pgxpool.Pool) (*FGIStyle, error) {
	_, err := pool.Exec(ctx, `DROP TABLE IF EXISTS fgi_records;
CREATE TABLE fgi_records (
	record_key BYTEA       PRIMARY KEY,
	record     JSONB       NOT NULL,
	purge_at   TIMESTAMPTZ NOT NULL
);
CREATE INDEX fgi_records_purge_at ON fgi_records (purge_at)`)
	if err != nil {
		return nil, err
	}
	return &FGIStyle{pool: pool}, nil
}

// Name is the row label.
func (s *FGIStyle) Name() string { return "fgi-style" }

// Close does nothing: the pool is the caller's.
func (s *FGIStyle) Close() error { return nil }

// fgiRecord is the JSONB record.
type fgiRecord struct {
	State       string `json:"state"`
	Fingerprint string `json:"fingerprint"`
	Owner       string `json:"owner,omitempty"`
	Fence       int64  `json:"fence"`
	Result      []byte `json:"result,omitempty"`
}

func fgiKey(k workload.Key) []byte {
	h := sha256.Sum256([]byte(k.Scope + "\x00" + k.ID))
	return h[:]
}

// transition runs one locked transition of k: decide gets the current record (nil if
// absent) and returns the record to write (nil: write nothing).
func (s *FGIStyle) transition(ctx context.Context, k workload.Key, decide func(cur *fgiRecord) (*fgiRecord, error)) error {
	key := fgiKey(k)
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1), clock_timestamp()`, int64(binary.BigEndian.Uint64(key))); err != nil {
			return err
		}
		var raw []byte
		var cur *fgiRecord
		err := tx.QueryRow(ctx, `SELECT record, purge_at FROM fgi_records WHERE record_key = $1 FOR UPDATE`, key).Scan(&raw, nil)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return err
		default:
			cur = new(fgiRecord)
			if err := json.Unmarshal(raw, cur); err != nil {
				return err
			}
		}
		next, err := decide(cur)
		if err != nil || next == nil {
			return err
		}
		b, err := json.Marshal(next)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO fgi_records (record_key, record, purge_at) VALUES ($1, $2, clock_timestamp() + interval '1 hour')
ON CONFLICT (record_key) DO UPDATE SET record = EXCLUDED.record, purge_at = EXCLUDED.purge_at`, key, b)
		return err
	})
}

// Do acquires k in one locked transaction and completes it in another.
func (s *FGIStyle) Do(ctx context.Context, k workload.Key, fp, result []byte) (bool, error) {
	owner := hex.EncodeToString(fp[:4]) + fmt.Sprint(randomToken())
	want := hex.EncodeToString(fp)
	replayed := false
	err := s.transition(ctx, k, func(cur *fgiRecord) (*fgiRecord, error) {
		switch {
		case cur == nil:
			return &fgiRecord{State: "in_progress", Fingerprint: want, Owner: owner, Fence: 1}, nil
		case cur.Fingerprint != want:
			return nil, ErrMismatch
		case cur.State != "completed":
			return nil, ErrInProgress
		}
		replayed = true
		return nil, nil
	})
	if err != nil || replayed {
		return replayed, err
	}
	err = s.transition(ctx, k, func(cur *fgiRecord) (*fgiRecord, error) {
		if cur == nil || cur.Owner != owner || cur.State != "in_progress" {
			return nil, errors.New("stores: fgi-style: lost ownership")
		}
		return &fgiRecord{State: "completed", Fingerprint: want, Fence: cur.Fence, Result: result}, nil
	})
	return false, err
}

// Replay answers a retry of k with the same locked transaction.
func (s *FGIStyle) Replay(ctx context.Context, k workload.Key, fp []byte) error {
	want := hex.EncodeToString(fp)
	return s.transition(ctx, k, func(cur *fgiRecord) (*fgiRecord, error) {
		switch {
		case cur == nil:
			return nil, ErrNotCommitted
		case cur.Fingerprint != want:
			return nil, ErrMismatch
		case cur.State != "completed":
			return nil, ErrNotCommitted
		}
		return nil, nil
	})
}
