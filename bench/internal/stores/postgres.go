package stores

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts/bench/internal/workload"
)

// Postgres is the idempotency-key table of Brandur Leach's Stripe-style design
// ("Implementing Stripe-like Idempotency Keys in Postgres"): a row per (user, key) under a
// unique index, a recovery point, a lock column, and the stored response. It runs in its
// leanest form, which favors PostgreSQL: the claim is one atomic INSERT .. ON CONFLICT DO
// NOTHING RETURNING (absent check and claim in one round trip and one commit), the commit
// is one UPDATE matching the claim's row. Both are autocommitted with
// synchronous_commit = on, so each waits for its WAL flush.
type Postgres struct {
	pool  *pgxpool.Pool
	table string
}

// OpenPostgres connects to dsn with a pool of conns connections and (re)creates the table.
func OpenPostgres(ctx context.Context, dsn string, conns int) (*Postgres, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	if conns < 4 {
		conns = 4
	}
	cfg.MaxConns = int32(conns)
	cfg.MinConns = int32(conns)
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s := &Postgres{pool: pool, table: "idempotency_keys"}
	var sc string
	if err := pool.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&sc); err != nil {
		pool.Close()
		return nil, err
	}
	var fsync string
	if err := pool.QueryRow(ctx, `SHOW fsync`).Scan(&fsync); err != nil {
		pool.Close()
		return nil, err
	}
	if sc != "on" || fsync != "on" {
		pool.Close()
		return nil, fmt.Errorf("stores: postgres must run with synchronous_commit=on and fsync=on (have %s, %s)", sc, fsync)
	}
	_, err = pool.Exec(ctx, `DROP TABLE IF EXISTS idempotency_keys;
CREATE TABLE idempotency_keys (
	id              BIGSERIAL   PRIMARY KEY,
	created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
	idempotency_key TEXT        NOT NULL CHECK (char_length(idempotency_key) <= 255),
	last_run_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
	locked_at       TIMESTAMPTZ DEFAULT now(),
	request_fingerprint BYTEA   NOT NULL,
	response_code   INT,
	response_body   BYTEA,
	recovery_point  TEXT        NOT NULL,
	scope           TEXT        NOT NULL CHECK (char_length(scope) <= 255)
);
CREATE UNIQUE INDEX idempotency_keys_scope_key ON idempotency_keys (scope, idempotency_key);`)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

func (s *Postgres) Name() string { return "postgres" }

func (s *Postgres) Close() error {
	s.pool.Close()
	return nil
}

func (s *Postgres) Do(ctx context.Context, k workload.Key, fp, result []byte) (bool, error) {
	var id int64
	err := s.pool.QueryRow(ctx, `INSERT INTO idempotency_keys (idempotency_key, scope, request_fingerprint, recovery_point)
VALUES ($1, $2, $3, 'started') ON CONFLICT (scope, idempotency_key) DO NOTHING RETURNING id`,
		k.ID, k.Scope, fp).Scan(&id)
	if errors.Is(err, pgx.ErrNoRows) {
		err := s.Replay(ctx, k, fp)
		return err == nil, err
	}
	if err != nil {
		return false, err
	}
	tag, err := s.pool.Exec(ctx, `UPDATE idempotency_keys SET locked_at = NULL, recovery_point = 'finished',
response_code = 200, response_body = $2, last_run_at = $3 WHERE id = $1 AND recovery_point = 'started'`,
		id, result, time.Now())
	if err != nil {
		return false, err
	}
	if tag.RowsAffected() != 1 {
		return false, errors.New("stores: postgres commit matched no claim")
	}
	return false, nil
}

func (s *Postgres) Replay(ctx context.Context, k workload.Key, fp []byte) error {
	var gotFP, body []byte
	var point string
	err := s.pool.QueryRow(ctx, `SELECT request_fingerprint, recovery_point, response_body FROM idempotency_keys
WHERE scope = $1 AND idempotency_key = $2`, k.Scope, k.ID).Scan(&gotFP, &point, &body)
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotCommitted
	}
	if err != nil {
		return err
	}
	v := make([]byte, recordHeader)
	v[0] = statePending
	if point == "finished" {
		v[0] = stateSucceeded
	}
	copy(v[1:33], gotFP)
	return checkRecord(v, fp)
}
