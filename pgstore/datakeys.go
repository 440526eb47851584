package pgstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"iter"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

// The scopes' data keys (driver.DataKeys: receipts' Options.Keyring) and their erasure
// (erase.go) live in two tables beside the partitioned families, named by ScopeID:
//
//	data_keys (scope_id, wrapped, created_at)
//	erasures  (scope_id, erased_at, until, records, key_destroyed)
//
// Both are created at Open if missing (privacySQL), under the schema lock: a schema of
// format 2 written before them gets them without a format change (older versions ignore
// them).

var _ driver.DataKeys = (*engine)(nil)

// privacySQL creates the privacy tables if they are missing.
func privacySQL(schema string) []string {
	return []string{
		`CREATE TABLE IF NOT EXISTS ` + schema + `.data_keys (
  scope_id   bytea       PRIMARY KEY,   -- driver.ScopeID of the scope: never the scope
  wrapped    bytea       NOT NULL,      -- the scope's data key, as the application's Keyring wrapped it
  created_at timestamptz NOT NULL
)`,
		`CREATE TABLE IF NOT EXISTS ` + schema + `.settings (
  name  text  PRIMARY KEY,   -- a setting of the root's (driver.Settings): "key-form" (Options.HashKeys)
  value bytea NOT NULL
)`,
		`CREATE TABLE IF NOT EXISTS ` + schema + `.erasures (
  scope_id      bytea       PRIMARY KEY,
  erased_at     timestamptz NOT NULL,
  until         timestamptz NOT NULL,   -- claims of the scope answer erased until then
  records       bigint      NOT NULL,   -- records deleted
  key_destroyed boolean     NOT NULL DEFAULT false,
  erasures      int         NOT NULL    -- times erased: an erasure while one is in force does not count
)`,
	}
}

// scopeLockClass is the class of the advisory lock of a scope (scopeLock): claims take it
// shared, EraseScope exclusive. A class of its own keeps it apart from the keys' locks
// (lockClass).
const scopeLockClass int32 = 0x52435053 // 'RCPS'

// scopeLock is the advisory lock id of the scope named id (a ScopeID).
func scopeLock(id []byte) int32 { return int32(binary.BigEndian.Uint32(id)) }

// DataKey returns the wrapped data key of the scope named id.
func (e *engine) DataKey(ctx context.Context, id []byte) ([]byte, bool, error) {
	var w []byte
	err := e.sealReader(ctx).QueryRow(ctx, `SELECT wrapped FROM `+e.q.schema+`.data_keys WHERE scope_id = $1`, id).Scan(&w)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, errorf("pgstore: read a data key: %w", err)
	}
	return w, true, nil
}

// PutDataKey stores wrapped for id unless a key is stored, and returns the one in force. It
// holds the scope's lock shared, as claims do, so it is ordered with the scope's erasure: it
// is refused (driver.ErrErased) once one is in force.
func (e *engine) PutDataKey(ctx context.Context, id, wrapped []byte) ([]byte, error) {
	var out []byte
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock_shared($1::int4, $2::int4)`, scopeLockClass, scopeLock(id)); err != nil {
			return err
		}
		var erased bool
		err := tx.QueryRow(ctx, `WITH t AS (SELECT `+e.q.clock("$3")+` AS now),
ins AS (
  INSERT INTO `+e.q.schema+`.data_keys (scope_id, wrapped, created_at)
  SELECT $1, $2, t.now FROM t
   WHERE NOT EXISTS (SELECT 1 FROM `+e.q.schema+`.erasures x WHERE x.scope_id = $1 AND x.until > t.now)
  ON CONFLICT (scope_id) DO NOTHING
  RETURNING wrapped
)
SELECT coalesce((SELECT wrapped FROM ins), (SELECT wrapped FROM `+e.q.schema+`.data_keys WHERE scope_id = $1)),
       EXISTS (SELECT 1 FROM `+e.q.schema+`.erasures x, t WHERE x.scope_id = $1 AND x.until > t.now)`,
			id, wrapped, e.nowArg()).Scan(&out, &erased)
		switch {
		case err != nil:
			return err
		case out == nil && erased:
			return fmt.Errorf("%w: scope %x", driver.ErrErased, id)
		case out == nil:
			// Another transaction inserted the key after this statement's snapshot (its
			// INSERT waited for it, then did nothing): a new statement sees it.
			return tx.QueryRow(ctx, `SELECT wrapped FROM `+e.q.schema+`.data_keys WHERE scope_id = $1`, id).Scan(&out)
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, driver.ErrErased) {
			return nil, err
		}
		return nil, errorf("pgstore: write a data key: %w", err)
	}
	return out, nil
}

// SwapDataKey replaces id's data key old by new if old is the one stored.
func (e *engine) SwapDataKey(ctx context.Context, id, old, new []byte) (bool, error) {
	tag, err := e.pool.Exec(ctx, `UPDATE `+e.q.schema+`.data_keys SET wrapped = $3 WHERE scope_id = $1 AND wrapped = $2`, id, old, new)
	if err != nil {
		return false, errorf("pgstore: write a data key: %w", err)
	}
	return tag.RowsAffected() == 1, nil
}

// ScanDataKeys yields every stored data key.
func (e *engine) ScanDataKeys(ctx context.Context) iter.Seq2[driver.DataKey, error] {
	return func(yield func(driver.DataKey, error) bool) {
		rows, err := e.pool.Query(ctx, `SELECT scope_id, wrapped FROM `+e.q.schema+`.data_keys ORDER BY scope_id`)
		if err != nil {
			yield(driver.DataKey{}, errorf("pgstore: scan data keys: %w", err))
			return
		}
		defer rows.Close()
		for rows.Next() {
			var k driver.DataKey
			if err := rows.Scan(&k.ID, &k.Wrapped); err != nil {
				yield(driver.DataKey{}, errorf("pgstore: scan data keys: %w", err))
				return
			}
			if !yield(k, nil) {
				return
			}
		}
		if err := rows.Err(); err != nil {
			yield(driver.DataKey{}, errorf("pgstore: scan data keys: %w", err))
		}
	}
}

var _ driver.Settings = (*engine)(nil)

// Setting returns the value recorded for name.
func (e *engine) Setting(ctx context.Context, name string) ([]byte, bool, error) {
	var v []byte
	err := e.pool.QueryRow(ctx, `SELECT value FROM `+e.q.schema+`.settings WHERE name = $1`, name).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, errorf("pgstore: read setting %s: %w", name, err)
	}
	return v, true, nil
}

// PutSetting records value for name unless a value is recorded, and returns the one in force.
func (e *engine) PutSetting(ctx context.Context, name string, value []byte) ([]byte, error) {
	if _, err := e.pool.Exec(ctx, `INSERT INTO `+e.q.schema+`.settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING`, name, value); err != nil {
		return nil, errorf("pgstore: record setting %s: %w", name, err)
	}
	v, _, err := e.Setting(ctx, name)
	return v, err
}

// SwapSetting replaces name's value old by new if old is the one recorded.
func (e *engine) SwapSetting(ctx context.Context, name string, old, new []byte) (bool, error) {
	tag, err := e.pool.Exec(ctx, `UPDATE `+e.q.schema+`.settings SET value = $3 WHERE name = $1 AND value = $2`, name, old, new)
	if err != nil {
		return false, errorf("pgstore: record setting %s: %w", name, err)
	}
	return tag.RowsAffected() == 1, nil
}
