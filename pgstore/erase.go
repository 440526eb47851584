package pgstore

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

// Erasing a scope (driver.Eraser).
//
// Every claim takes, besides its key's advisory lock, its scope's advisory lock shared
// (scopeLockClass) and then checks the erasures table, in a function whose statements each
// read a snapshot taken after the lock (the first claims' functions: freshFnSQL,
// freshManyFnSQL; a key's later claim statements run in the same transaction): an erasure in force raises
// errErasedCode, which the claim answers as driver.Erased. EraseScope takes the scope's lock
// exclusive, so it waits for the claims of the scope in flight (a DoTx holds it to its end),
// and new ones wait for it; then one transaction records the erasure and deletes the scope's
// records, markers and data key (a statement per table, whatever the number of records, or of
// partitions), and commits: a crash leaves the scope whole or erased. Writes of leases
// already held (Renew, Finish) take no scope lock: the deletion takes their rows' locks, so
// each either lands before it (and is deleted) or finds no row (ErrLeaseLost); a write that
// moved its row to a newer partition meanwhile makes the deletion fail with a serialization
// error, and the transaction is run again.

var _ driver.Eraser = (*engine)(nil)

// errErasedCode is the SQLSTATE the scope check raises for a claim in an erased scope.
const errErasedCode = "RC410"

// claimScopeSQL creates the functions claims called after their key's lock before the first
// claims' functions (freshFnSQL, freshManyFnSQL) took the scope's lock themselves; they are
// still created for binaries of that time that share the schema: claim_scope for
// one key, claim_scopes for a batch (it drops from receipts.locked the keys whose scope lock
// it cannot take at once, or whose scope is erased: they claim alone). Each statement of a
// VOLATILE plpgsql function reads a snapshot of its own, taken when it starts: the erasures
// are read after the lock is held.
func claimScopeSQL(schema string) []string {
	cls := strconv.Itoa(int(scopeLockClass))
	return []string{
		`CREATE OR REPLACE FUNCTION ` + schema + `.claim_scope(slock int4, sid bytea, clk timestamptz) RETURNS int
LANGUAGE plpgsql VOLATILE AS $$
DECLARE u timestamptz;
BEGIN
  PERFORM pg_advisory_xact_lock_shared(` + cls + `, slock);
  SELECT e.until INTO u FROM ` + schema + `.erasures e WHERE e.scope_id = sid AND e.until > clk;
  IF FOUND THEN
    RAISE EXCEPTION 'receipts: scope erased' USING ERRCODE = '` + errErasedCode + `';
  END IF;
  RETURN 1;
END $$`,
		`CREATE OR REPLACE FUNCTION ` + schema + `.claim_scopes(slocks int4[], sids bytea[], clk timestamptz) RETURNS text
LANGUAGE plpgsql VOLATILE AS $$
DECLARE kept text[] := '{}'; i bigint;
BEGIN
  FOREACH i IN ARRAY coalesce(string_to_array(nullif(current_setting('receipts.locked'), ''), ',')::bigint[], '{}') LOOP
    IF pg_try_advisory_xact_lock_shared(` + cls + `, slocks[i]) THEN
      IF NOT EXISTS (SELECT 1 FROM ` + schema + `.erasures e WHERE e.scope_id = sids[i] AND e.until > clk) THEN
        kept := kept || i::text;
      END IF;
    END IF;
  END LOOP;
  PERFORM set_config('receipts.locked', array_to_string(kept, ','), true);
  RETURN array_to_string(kept, ',');
END $$`,
	}
}

// erasedClaim is a claim's answer in an erased scope (the scope check raised errErasedCode):
// the erasure in force, read afresh.
func (e *engine) erasedClaim(ctx context.Context, req driver.ClaimRequest) (driver.ClaimResult, error) {
	er, found, err := e.Erasure(ctx, driver.ScopeID(e.secret, req.Key.Scope))
	if err != nil {
		return driver.ClaimResult{}, errorf("pgstore: claim: %w", err)
	}
	if !found { // cannot happen: erasure records are never deleted
		return driver.ClaimResult{}, errorf("pgstore: claim: the scope check found an erasure that is gone")
	}
	now, err := e.Now(ctx)
	if err != nil {
		return driver.ClaimResult{}, err
	}
	return driver.ClaimResult{Outcome: driver.Erased, Record: driver.Record{Key: req.Key, UpdatedAt: er.At, ExpiresAt: er.Until}, Now: now}, nil
}

func erasedCode(err error) bool { return pgCode(err) == errErasedCode }

const erasureCols = `scope_id, erased_at, until, records, key_destroyed, erasures`

func (e *engine) scanErasure(r pgx.Row, er *driver.Erasure) error {
	var n int32
	if err := r.Scan(&er.ID, &er.At, &er.Until, &er.Records, &er.KeyDestroyed, &n); err != nil {
		return err
	}
	er.Count = uint32(n)
	return nil
}

// sealTxKey is the context key under which DoTx and CommitTx hand the root's seal of their
// result (receipts' Options.Keyring) the transaction that will record it: the seal reads
// the scope's erasure count (and, now and then, its data key) before it encrypts, and a read
// of its own would need another of the pool's connections, which with as many DoTx calls as
// the pool has connections, each holding one, nobody would give back (the seal runs on a
// context that does not end).
type sealTxKey struct{}

// sealTx is the transaction a context carries for the seal's reads: tx, while it is open
// (DoTx's: until DoTx ends it and hands its connection back to the pool).
type sealTx struct {
	tx    pgx.Tx
	ended func() bool // nil: the caller's transaction (CommitTx), open while the seal runs
}

// withSealTx returns ctx carrying st for the seal's reads (nil: none).
func withSealTx(ctx context.Context, st *sealTx) context.Context {
	return context.WithValue(ctx, sealTxKey{}, st)
}

// rowQuerier is what Erasure and DataKey read with: the pool or a transaction.
type rowQuerier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// sealReader returns the transaction ctx carries for the seal's reads if it is open, the
// pool otherwise. Reading in that transaction is as fresh as reading outside:
// it runs at READ COMMITTED, and a DoTx's holds the scope's lock shared, so no erasure of the
// scope can happen before it ends.
func (e *engine) sealReader(ctx context.Context) rowQuerier {
	if st, _ := ctx.Value(sealTxKey{}).(*sealTx); st != nil && (st.ended == nil || !st.ended()) {
		// In a transaction, or in one a failed statement aborted: the read fails at once
		// then, as the commit would, rather than wait for another connection.
		if c := st.tx.Conn(); c != nil && (c.PgConn().TxStatus() == 'T' || c.PgConn().TxStatus() == 'E') {
			return st.tx
		}
	}
	return e.pool
}

// Erasure returns the erasure record of the scope named id.
func (e *engine) Erasure(ctx context.Context, id []byte) (driver.Erasure, bool, error) {
	var er driver.Erasure
	err := e.scanErasure(e.sealReader(ctx).QueryRow(ctx, `SELECT `+erasureCols+` FROM `+e.q.schema+`.erasures WHERE scope_id = $1`, id), &er)
	if errors.Is(err, pgx.ErrNoRows) {
		return driver.Erasure{}, false, nil
	}
	if err != nil {
		return driver.Erasure{}, false, errorf("pgstore: read an erasure record: %w", err)
	}
	return er, true, nil
}

// Erasures yields every erasure record.
func (e *engine) Erasures(ctx context.Context) iter.Seq2[driver.Erasure, error] {
	return func(yield func(driver.Erasure, error) bool) {
		rows, err := e.pool.Query(ctx, `SELECT `+erasureCols+` FROM `+e.q.schema+`.erasures ORDER BY erased_at, scope_id`)
		if err != nil {
			yield(driver.Erasure{}, errorf("pgstore: scan erasures: %w", err))
			return
		}
		defer rows.Close()
		for rows.Next() {
			var er driver.Erasure
			if err := e.scanErasure(rows, &er); err != nil {
				yield(driver.Erasure{}, errorf("pgstore: scan erasures: %w", err))
				return
			}
			if !yield(er, nil) {
				return
			}
		}
		if err := rows.Err(); err != nil {
			yield(driver.Erasure{}, errorf("pgstore: scan erasures: %w", err))
		}
	}
}

// MarkKeyDestroyed records that the Keyring destroyed the key of id.
func (e *engine) MarkKeyDestroyed(ctx context.Context, id []byte) error {
	if _, err := e.pool.Exec(ctx, `UPDATE `+e.q.schema+`.erasures SET key_destroyed = true WHERE scope_id = $1`, id); err != nil {
		return errorf("pgstore: write an erasure record: %w", err)
	}
	return nil
}

// EraseScope erases scope (see the top of this file): one transaction, run again on a
// serialization failure or a deadlock.
func (e *engine) EraseScope(ctx context.Context, scope string) (driver.Erasure, error) {
	id := driver.ScopeID(e.secret, scope)
	var er driver.Erasure
	var err error
	for attempt := 0; ; attempt++ {
		if er, err = e.eraseOnce(ctx, scope, id); err == nil || !retryable(err) || attempt >= maxOther {
			break
		}
		if err := sleep(ctx, time.Millisecond<<min(attempt, 6)); err != nil {
			return driver.Erasure{}, err
		}
	}
	if err != nil {
		return driver.Erasure{}, errorf("pgstore: erase: %w", err)
	}
	return er, nil
}

func (e *engine) eraseOnce(ctx context.Context, scope string, id []byte) (driver.Erasure, error) {
	var er driver.Erasure
	err := pgx.BeginTxFunc(ctx, e.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1::int4, $2::int4)`, scopeLockClass, scopeLock(id)); err != nil {
			return err
		}
		s := e.q.schema
		// An erasure in force keeps its time and count; one no longer in force is replaced.
		if _, err := tx.Exec(ctx, `WITH t AS (SELECT `+e.q.clock("$2")+` AS now)
INSERT INTO `+s+`.erasures AS x (scope_id, erased_at, until, records, key_destroyed, erasures)
SELECT $1, t.now, t.now + $3::bigint * interval '1 microsecond', 0, false, 1 FROM t
ON CONFLICT (scope_id) DO UPDATE SET
  erased_at     = CASE WHEN x.until > EXCLUDED.erased_at THEN x.erased_at ELSE EXCLUDED.erased_at END,
  key_destroyed = x.until > EXCLUDED.erased_at AND x.key_destroyed,
  erasures      = CASE WHEN x.until > EXCLUDED.erased_at THEN x.erasures ELSE x.erasures + 1 END,
  until         = CASE WHEN x.until > EXCLUDED.erased_at THEN x.until ELSE EXCLUDED.until END`,
			id, e.nowArg(), (e.o.Retention + max(e.o.TombstoneWindow, 0)).Microseconds()); err != nil {
			return fmt.Errorf("record the erasure: %w", err)
		}
		var n int64
		if err := tx.QueryRow(ctx, `WITH d AS (DELETE FROM `+s+`.records WHERE scope = $1 RETURNING 1) SELECT count(*) FROM d`, []byte(scope)).Scan(&n); err != nil {
			return fmt.Errorf("delete the records: %w", err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+s+`.markers WHERE scope = $1`, []byte(scope)); err != nil {
			return fmt.Errorf("delete the tombstones: %w", err)
		}
		if _, err := tx.Exec(ctx, `DELETE FROM `+s+`.data_keys WHERE scope_id = $1`, id); err != nil {
			return fmt.Errorf("delete the data key: %w", err)
		}
		return e.scanErasure(tx.QueryRow(ctx, `UPDATE `+s+`.erasures SET records = records + $2 WHERE scope_id = $1 RETURNING `+erasureCols, id, n), &er)
	})
	return er, err
}
