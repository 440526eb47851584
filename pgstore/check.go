package pgstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
)

var _ driver.Checker = (*engine)(nil)

// Check implements driver.Checker, in one read-only REPEATABLE READ transaction (one
// snapshot) and by the database's clock (or the injected one). It checks that meta holds
// one sane row (format, epoch width, settings, secret, not created in the future); that
// every row of records has a valid key, state, fingerprint, attempts and token (issued by
// token_seq), times in order, the lease and result its state calls for, and sits in the
// partition of its last write, not more than one epoch ahead of now; that no key is
// visible in two partitions; and that no partition still holding live records has been
// detached (reads no longer see it). A problem is in the report; an error is what stopped
// the check.
func (e *engine) Check(ctx context.Context) (driver.CheckReport, error) {
	rep := driver.CheckReport{Problems: []driver.Problem{}}
	err := pgx.BeginTxFunc(ctx, e.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var now time.Time
		if err := tx.QueryRow(ctx, `SELECT `+e.q.clock("$1"), e.nowArg()).Scan(&now); err != nil {
			return err
		}
		c := pgChecker{e: e, tx: tx, rep: &rep, now: now.UnixMicro()}
		if err := c.meta(ctx); err != nil {
			return err
		}
		if err := c.records(ctx); err != nil {
			return err
		}
		return c.partitions(ctx)
	})
	if err != nil {
		return rep, errorf("pgstore: check: %w", err)
	}
	return rep, nil
}

// pgChecker is one Check's state.
type pgChecker struct {
	e     *engine
	tx    pgx.Tx
	rep   *driver.CheckReport
	now   int64 // µs
	width int64 // µs, from meta (0 if unusable)
}

func (c *pgChecker) add(key string, epoch int64, format string, args ...any) {
	c.rep.Problems = append(c.rep.Problems, driver.Problem{Key: key, Epoch: epoch, What: fmt.Sprintf(format, args...)})
}

// meta checks the meta row and reads the token sequence.
func (c *pgChecker) meta(ctx context.Context) error {
	s := c.e.q.schema
	var rows int
	var format int
	var width, ret, ttl int64
	var secret int
	var created time.Time
	err := c.tx.QueryRow(ctx, `SELECT count(*) OVER (), format, epoch_width_us, retention_us, lease_ttl_us,
       length(secret), created_at FROM `+s+`.meta`).Scan(&rows, &format, &width, &ret, &ttl, &secret, &created)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		c.add("meta", -1, "no meta row")
	case err != nil:
		return err
	case rows != 1:
		c.add("meta", -1, "%d meta rows, want 1", rows)
	case format != formatVersion:
		c.add("meta", -1, "format %d, want %d", format, formatVersion)
	case width <= 0:
		c.add("meta", -1, "epoch width %d µs", width)
	case ret <= 0 || ttl <= 0 || ttl >= ret:
		c.add("meta", -1, "retention %d µs, lease TTL %d µs", ret, ttl)
	case secret < 16:
		c.add("meta", -1, "a secret of %d bytes", secret)
	case created.UnixMicro() > c.now+width:
		c.add("meta", -1, "created in the future (%s)", created.UTC())
	default:
		c.width = width
		c.rep.EpochWidth = time.Duration(width) * time.Microsecond
	}
	var last int64
	var called bool
	if err := c.tx.QueryRow(ctx, `SELECT last_value, is_called FROM `+s+`.token_seq`).Scan(&last, &called); err != nil {
		return err
	}
	c.rep.TokenCeiling = uint64(last) // the next token is above it
	if called {
		c.rep.TokenCeiling++
	}
	return nil
}

// records checks every row of records, in key order so that a key stored twice is seen.
func (c *pgChecker) records(ctx context.Context) error {
	rows, err := c.tx.Query(ctx, `SELECT scope, id, epoch, state, length(fp), token, attempts, length(nonce),
       (extract(epoch FROM created_at) * 1000000)::bigint, (extract(epoch FROM updated_at) * 1000000)::bigint,
       (extract(epoch FROM lease_expires_at) * 1000000)::bigint, result IS NOT NULL
  FROM `+c.e.q.schema+`.records ORDER BY scope, id, epoch DESC`)
	if err != nil {
		return err
	}
	defer rows.Close()
	retention := c.e.o.Retention.Microseconds()
	epochs := map[int64]bool{}
	var prev driver.Key
	prevVisible, prevEpoch := false, int64(0)
	for rows.Next() {
		var scope, id []byte
		var epoch, token, created, updated int64
		var lease *int64
		var state int16
		var fpLen, attempts, nonceLen int
		var hasResult bool
		if err := rows.Scan(&scope, &id, &epoch, &state, &fpLen, &token, &attempts, &nonceLen, &created, &updated, &lease, &hasResult); err != nil {
			return err
		}
		c.rep.Records++
		epochs[epoch] = true
		k := driver.Key{Scope: string(scope), ID: string(id)}
		name := k.String()
		visible := c.now < updated+retention
		if !visible {
			c.rep.Expired++
		}
		if k == prev && visible && prevVisible {
			c.add(name, epoch, "stored twice, also in epoch %d", prevEpoch)
		}
		prev, prevVisible, prevEpoch = k, visible, epoch

		switch {
		case len(scope) == 0 || len(scope) > receipts.MaxKeyPartLen || len(id) == 0 || len(id) > receipts.MaxKeyPartLen:
			c.add(name, epoch, "key of %d+%d bytes, want 1 to %d each", len(scope), len(id), receipts.MaxKeyPartLen)
		case fpLen == 0 || fpLen > receipts.MaxFingerprintLen:
			c.add(name, epoch, "fingerprint of %d bytes", fpLen)
		case attempts < 1:
			c.add(name, epoch, "attempts is %d", attempts)
		case created > updated:
			c.add(name, epoch, "created after its last write")
		}
		switch driver.State(state) {
		case driver.Pending:
			if lease == nil {
				c.add(name, epoch, "pending without a lease expiry")
			}
			if hasResult {
				c.add(name, epoch, "pending with a result")
			}
		case driver.Succeeded, driver.Failed:
			if !hasResult {
				c.add(name, epoch, "finished without a result")
			}
		default:
			c.add(name, epoch, "unknown state %d", state)
		}
		if token < 1 || uint64(token) >= c.rep.TokenCeiling {
			c.add(name, epoch, "token %d not issued by the token sequence (next %d)", token, c.rep.TokenCeiling)
		}
		if c.width > 0 {
			if want := floorDiv(updated, c.width); epoch != want {
				c.add(name, epoch, "last written at %s (epoch %d) but stored in epoch %d",
					time.UnixMicro(updated).UTC().Format(time.RFC3339Nano), want, epoch)
			}
			if nowEpoch := floorDiv(c.now, c.width); epoch > nowEpoch+1 {
				c.add(name, epoch, "in epoch %d, more than one epoch ahead of now (epoch %d)", epoch, nowEpoch)
			}
		}
	}
	if err := rows.Err(); err != nil {
		return err
	}
	c.rep.Epochs = len(epochs)
	return nil
}

// partitions reports a detached partition whose records could still be visible, or whose
// tombstone markers could still be in force: reads no longer see them. (Detaching a dead partition is how GC drops it: that is no problem.)
func (c *pgChecker) partitions(ctx context.Context) error {
	if c.width <= 0 {
		return nil
	}
	parts, err := c.e.partitions(ctx)
	if err != nil {
		return err
	}
	retention := c.e.o.Retention.Microseconds()
	for _, p := range parts {
		switch {
		case p.attached:
		case p.family == famRecords && (p.epoch+1)*c.width+retention > c.now:
			c.add(p.name, p.epoch, "partition detached while its records are still within retention")
		case p.family == famMarkers && c.e.partEnd(p).UnixMicro()+c.e.tombUS() > c.now && c.e.tombs():
			c.add(p.name, p.epoch, "partition detached while its tombstones are still in force")
		}
	}
	return nil
}

// floorDiv is a / b rounded down (b > 0).
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
