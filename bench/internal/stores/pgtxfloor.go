package stores

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts/bench/internal/workload"
)

// PGTxFloor is the least a correct design must do for an operation whose effect is a row in
// the same PostgreSQL transaction as its receipt (what pgstore.DoTx does): one plain
// transaction that inserts the claim (INSERT .. ON CONFLICT DO NOTHING RETURNING: absent
// check and claim in one statement; a conflict is a retry, answered by reading the row),
// writes the caller's effect row, updates the claim to finished, and commits, with one WAL
// flush. Three round trips, as DoTx's: [BEGIN; claim], the effect (the caller's statement),
// [finish; COMMIT]. No partitions, no advisory lock, no lease, no tombstones: a floor, not a
// design. A retry is one plain SELECT by primary key, as pg-floor's.
type PGTxFloor struct {
	pool *pgxpool.Pool
}

// OpenPGTxFloor (re)creates the floor's tables (claims and effects) on pool, which stays
// the caller's.
func OpenPGTxFloor(ctx context.Context, pool *pgxpool.Pool) (*PGTxFloor, error) {
	_, err := pool.Exec(ctx, `DROP TABLE IF EXISTS pg_tx_floor, pg_tx_floor_effects;
CREATE TABLE pg_tx_floor (
	scope      TEXT        NOT NULL,
	id         TEXT        NOT NULL,
	fp         BYTEA       NOT NULL,
	state      SMALLINT    NOT NULL,
	token      BIGINT      NOT NULL,
	result     BYTEA,
	updated_at TIMESTAMPTZ NOT NULL,
	PRIMARY KEY (scope, id)
);
CREATE TABLE pg_tx_floor_effects (`+EffectColumns+`)`)
	if err != nil {
		return nil, err
	}
	return &PGTxFloor{pool: pool}, nil
}

// EffectColumns is the effect table's definition, the same for the floor and for DoTx's fn
// in the benchmark: one row per first call, keyed as the operation.
const EffectColumns = `scope TEXT NOT NULL, id TEXT NOT NULL, payload BYTEA NOT NULL, PRIMARY KEY (scope, id)`

// Name is the row label.
func (s *PGTxFloor) Name() string { return "pg-tx-floor" }

// Close does nothing: the pool is the caller's.
func (s *PGTxFloor) Close() error { return nil }

// Do runs k's claim, effect and finish in one transaction.
func (s *PGTxFloor) Do(ctx context.Context, k workload.Key, fp, result []byte) (replayed bool, err error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer func() {
		if c.Conn().PgConn().TxStatus() != 'I' {
			if _, rerr := c.Exec(context.WithoutCancel(ctx), "ROLLBACK"); rerr != nil && err == nil {
				err = rerr
			}
		}
		c.Release()
	}()
	token := randomToken()
	b := &pgx.Batch{}
	b.Queue("BEGIN")
	b.Queue(`INSERT INTO pg_tx_floor (scope, id, fp, state, token, updated_at)
VALUES ($1, $2, $3, 1, $4, now()) ON CONFLICT (scope, id) DO NOTHING RETURNING 1`, k.Scope, k.ID, fp, token)
	br := c.SendBatch(ctx, b)
	_, err = br.Exec()
	var one int
	if err == nil {
		err = br.QueryRow().Scan(&one)
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, pgx.ErrNoRows) { // a retry: end the transaction, read the record
		if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
			return false, err
		}
		err := s.Replay(ctx, k, fp)
		return err == nil, err
	}
	if err != nil {
		return false, err
	}
	if _, err := c.Exec(ctx, `INSERT INTO pg_tx_floor_effects (scope, id, payload) VALUES ($1, $2, $3)`, k.Scope, k.ID, result); err != nil {
		return false, err
	}
	b = &pgx.Batch{}
	b.Queue(`UPDATE pg_tx_floor SET state = 2, result = $3, updated_at = now()
WHERE scope = $1 AND id = $2 AND token = $4`, k.Scope, k.ID, result, token)
	b.Queue("COMMIT")
	br = c.SendBatch(ctx, b)
	tag, err := br.Exec()
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.New("stores: pg-tx-floor finish matched no claim")
	}
	if err == nil {
		_, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return false, err
}

// Replay reads k with one plain SELECT, as pg-floor's.
func (s *PGTxFloor) Replay(ctx context.Context, k workload.Key, fp []byte) error {
	return replaySelect(ctx, s.pool, `SELECT fp, state, result FROM pg_tx_floor WHERE scope = $1 AND id = $2`, k, fp)
}
