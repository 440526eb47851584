package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/bench/internal/engine"
	"github.com/receiptstore/receipts/bench/internal/pgtemp"
	"github.com/receiptstore/receipts/bench/internal/stores"
	"github.com/receiptstore/receipts/bench/internal/workload"
	"github.com/receiptstore/receipts/pgstore"
)

// withPostgres runs fn with the DSN of -dsn, or of a throwaway cluster it starts (and
// stops) when the server binaries are installed.
func withPostgres(ctx context.Context, cfg *config, fn func(dsn, what string) error) error {
	if cfg.dsn != "" {
		return fn(cfg.dsn, "given DSN")
	}
	progress("starting a throwaway PostgreSQL cluster")
	c, err := pgtemp.Start(ctx)
	if err != nil {
		return fmt.Errorf("PostgreSQL: no -dsn given and the throwaway cluster did not start: %w", err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			progress("stopping PostgreSQL: %v", err)
		}
	}()
	return fn(c.DSN, "throwaway cluster ("+filepath.Base(filepath.Dir(c.BinDir))+")")
}

// walPos returns the server's current WAL insert position.
func walPos(ctx context.Context, pool *pgxpool.Pool) (string, error) {
	var lsn string
	err := pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn)
	return lsn, err
}

// walSince returns the WAL bytes written since lsn.
func walSince(ctx context.Context, pool *pgxpool.Pool, lsn string) (int64, error) {
	var n int64
	err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::bigint`, lsn).Scan(&n)
	return n, err
}

// purgeResult is one way of reclaiming the expired receipts.
type purgeResult struct {
	Method   string        `json:"method"`
	Rows     int           `json:"rows"`
	Duration time.Duration `json:"duration_ns"`
	WALBytes int64         `json:"wal_bytes"`
	Detail   string        `json:"detail"`
}

// runPurge measures reclaiming n expired receipts: pgstore's GC (dropping the dead
// partition) against a batched DELETE of the same number of rows from a plain table (the
// FGI-style cleanup), each timed and with the WAL it wrote (pg_current_wal_lsn before and
// after, a CHECKPOINT first so both pay the same full-page writes).
func runPurge(ctx context.Context, cfg *config) error {
	n := int(cfg.purge)
	return withPostgres(ctx, cfg, func(dsn, what string) error {
		pool, err := stores.OpenPGPool(ctx, dsn, 17)
		if err != nil {
			return err
		}
		defer pool.Close()
		var out []purgeResult
		r, err := purgePGStore(ctx, pool, n)
		if err != nil {
			return fmt.Errorf("pgstore GC: %w", err)
		}
		out = append(out, r)
		r, err = purgeDelete(ctx, pool, n)
		if err != nil {
			return fmt.Errorf("batched DELETE: %w", err)
		}
		out = append(out, r)
		if cfg.json {
			return writeJSONValue(stdout, map[string]any{"machine": describeMachine(), "postgres": what, "purge": out})
		}
		fmt.Fprintf(stdout, "receiptbench -purge: reclaim %d expired receipts on PostgreSQL (%s, fsync on)\n", n, what)
		t := &table{header: []string{"method", "rows", "time", "WAL"}, left: map[int]bool{0: true}}
		for _, r := range out {
			t.rows = append(t.rows, []string{r.Method, fmtOps(float64(r.Rows)), fmtDur(r.Duration), fmtOps(float64(r.WALBytes)) + " B (" + fmtBytes(uint64(r.WALBytes)) + ")"})
		}
		t.write(stdout)
		for _, r := range out {
			fmt.Fprintf(stdout, "  %s: %s\n", r.Method, r.Detail)
		}
		return nil
	})
}

// purgeSeed is how many receipts the pgstore load writes through DB.Do; the rest are copies
// of them under other IDs (see purgePGStore).
const purgeSeed = 1000

// purgePGStore fills a pgstore schema with n receipts written 3 days ago with a 1h
// retention, then runs DB.GC once with the clock past their retention.
//
// The load writes purgeSeed receipts through DB.Do and then copies their rows under other
// IDs (and fresh tokens) with one INSERT .. SELECT into the schema's records table: writing
// a million receipts through Do would take minutes on this machine, and what GC reclaims is
// the same rows in the same partition. The copy reads pgstore's table layout (format 1); it
// changes nothing else.
func purgePGStore(ctx context.Context, pool *pgxpool.Pool, n int) (purgeResult, error) {
	const schema = "bench_purge"
	res := purgeResult{Method: "pgstore GC (drop partitions)", Rows: n}
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
		return res, err
	}
	var clock atomic.Int64
	clock.Store(time.Now().Add(-72 * time.Hour).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	db, err := pgstore.Open(ctx, pool, engine.PGOptions(schema, now))
	if err != nil {
		return res, err
	}
	defer db.Close()
	seed := min(n, purgeSeed)
	progress("purge: writing %d receipts through pgstore (clock 3 days back, retention 1h)", seed)
	var next atomic.Uint64
	run := workload.RunID()
	lr := workload.Run(ctx, 16, 0, uint64(seed), func(ctx context.Context, _ int, _ uint64) error {
		k := workload.NewKey(run, 0, next.Add(1))
		_, err := db.Do(ctx, receipts.Key{Scope: k.Scope, ID: k.ID}, workload.Fingerprint(k), func(context.Context, *receipts.Lease) ([]byte, error) {
			return workload.ResultFor(k), nil
		})
		return err
	})
	if lr.FirstErr != nil {
		return res, lr.FirstErr
	}
	if copies := (n - seed + seed - 1) / seed; copies > 0 {
		progress("purge: copying them to %d rows", n)
		_, err := pool.Exec(ctx, `INSERT INTO `+schema+`.records (scope, id, epoch, state, fp, token, attempts, nonce,
  created_at, updated_at, lease_expires_at, result)
SELECT r.scope, r.id || convert_to('-c' || g::text, 'UTF8'), r.epoch, r.state, r.fp, nextval('`+schema+`.token_seq'),
       r.attempts, r.nonce, r.created_at, r.updated_at, r.lease_expires_at, r.result
  FROM `+schema+`.records r, generate_series(1, $1::int) g
 LIMIT $2::int`, copies, n-seed)
		if err != nil {
			return res, fmt.Errorf("copy the receipts: %w", err)
		}
	}
	var rows int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.records`).Scan(&rows); err != nil {
		return res, err
	}
	if rows != n {
		return res, fmt.Errorf("loaded %d receipts, want %d", rows, n)
	}
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return res, err
	}
	clock.Add(int64(2*time.Hour + 30*time.Minute)) // every loaded receipt is past retention
	lsn, err := walPos(ctx, pool)
	if err != nil {
		return res, err
	}
	progress("purge: DB.GC")
	start := time.Now()
	st, err := db.GC(ctx)
	res.Duration = time.Since(start)
	if err != nil {
		return res, err
	}
	if res.WALBytes, err = walSince(ctx, pool, lsn); err != nil {
		return res, err
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+schema+`.records`).Scan(&rows); err != nil {
		return res, err
	}
	if rows != 0 {
		return res, fmt.Errorf("GC left %d of %d expired receipts", rows, n)
	}
	res.Detail = fmt.Sprintf("DB.GC: %d %s dropped (%s freed), %d statements; creates the next partitions too; %d left",
		st.EpochsDropped, map[bool]string{true: "partition", false: "partitions"}[st.EpochsDropped == 1], fmtBytes(st.BytesFreed), st.Writes, rows)
	_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE")
	return res, nil
}

// purgeDelete fills an FGI-style table (JSONB record, purge_at index) with n expired rows
// and deletes them as FGI's Cleanup does: batches of 10,000 picked by the purge_at index
// FOR UPDATE SKIP LOCKED, until none is left.
func purgeDelete(ctx context.Context, pool *pgxpool.Pool, n int) (purgeResult, error) {
	const batch = 10_000
	res := purgeResult{Method: "batched DELETE (FGI-style cleanup)", Rows: n}
	if _, err := stores.OpenFGIStyle(ctx, pool); err != nil { // (re)creates fgi_records
		return res, err
	}
	progress("purge: loading %d expired rows into fgi_records", n)
	_, err := pool.Exec(ctx, `INSERT INTO fgi_records (record_key, record, purge_at)
SELECT sha256(convert_to('k' || g::text, 'UTF8')),
       jsonb_build_object('state', 'completed', 'fingerprint', encode(sha256(convert_to(g::text, 'UTF8')), 'hex'),
                          'fence', 1, 'result', encode(convert_to(repeat('x', 128), 'UTF8'), 'base64')),
       clock_timestamp() - interval '1 day' + g * interval '1 microsecond'
  FROM generate_series(1, $1::int) g`, n)
	if err != nil {
		return res, err
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE fgi_records"); err != nil {
		return res, err
	}
	if _, err := pool.Exec(ctx, "CHECKPOINT"); err != nil {
		return res, err
	}
	lsn, err := walPos(ctx, pool)
	if err != nil {
		return res, err
	}
	progress("purge: batched DELETE")
	start := time.Now()
	batches, total := 0, int64(0)
	for {
		tag, err := pool.Exec(ctx, `WITH doomed AS (
  SELECT record_key FROM fgi_records WHERE purge_at <= clock_timestamp()
   ORDER BY purge_at LIMIT $1 FOR UPDATE SKIP LOCKED)
DELETE FROM fgi_records f USING doomed WHERE f.record_key = doomed.record_key`, batch)
		if err != nil {
			return res, err
		}
		batches++
		total += tag.RowsAffected()
		if tag.RowsAffected() == 0 {
			break
		}
	}
	res.Duration = time.Since(start)
	if res.WALBytes, err = walSince(ctx, pool, lsn); err != nil {
		return res, err
	}
	if total != int64(n) {
		return res, fmt.Errorf("deleted %d rows, want %d", total, n)
	}
	res.Detail = fmt.Sprintf("%d DELETE statements of up to %d rows; the table's space is reusable after VACUUM, not returned", batches, batch)
	_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS fgi_records")
	return res, nil
}

// wakeResult is the wake-up latency of one mode.
type wakeResult struct {
	Mode      string        `json:"mode"`
	Samples   int           `json:"samples"`
	P50       time.Duration `json:"p50_ns"`
	P99       time.Duration `json:"p99_ns"`
	Max       time.Duration `json:"max_ns"`
	CommitP50 time.Duration `json:"commit_p50_ns"`
}

// runWake measures how soon a waiter on node B learns that node A committed the key it waits
// for: A claims a key, B's DB.Do on it waits (in flight elsewhere), a quiet 20 ms, then A
// commits; the latency runs from the start of A's Commit until B's Do returns with the
// receipt (so it includes A's commit flush, reported alone as commit p50). Node B listens
// (LISTEN on its own session: woken by A's coalesced NOTIFY) or is poll-only (no LISTEN
// session: it learns by re-reading).
func runWake(ctx context.Context, cfg *config) error {
	return withPostgres(ctx, cfg, func(dsn, what string) error {
		pool, err := stores.OpenPGPool(ctx, dsn, 8)
		if err != nil {
			return err
		}
		defer pool.Close()
		const schema = "bench_wake"
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE"); err != nil {
			return err
		}
		defer func() { _, _ = pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+schema+" CASCADE") }()
		a, err := pgstore.Open(ctx, pool, engine.PGOptions(schema, nil))
		if err != nil {
			return err
		}
		defer a.Close()
		var out []wakeResult
		for _, listen := range []bool{true, false} {
			opts := engine.PGOptions(schema, nil)
			mode := "poll-only (no LISTEN session, PollInterval 1s)"
			if listen {
				opts.ListenConn = func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, dsn) }
				mode = "LISTEN (coalesced NOTIFY)"
			}
			b, err := pgstore.Open(ctx, pool, opts)
			if err != nil {
				return err
			}
			progress("wake: %s, %d samples", mode, cfg.wakeN)
			r, err := wakeSamples(ctx, a, b, cfg.wakeN)
			if cerr := b.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("wake (%s): %w", mode, err)
			}
			r.Mode = mode
			out = append(out, r)
		}
		if cfg.json {
			return writeJSONValue(stdout, map[string]any{"machine": describeMachine(), "postgres": what, "wake": out})
		}
		fmt.Fprintf(stdout, "receiptbench -wake: node A commits, a waiter on node B returns (%s, fsync on)\n", what)
		t := &table{header: []string{"node B", "samples", "p50", "p99", "max", "A's commit p50"}, left: map[int]bool{0: true}}
		for _, r := range out {
			t.rows = append(t.rows, []string{r.Mode, fmt.Sprint(r.Samples), fmtDur(r.P50), fmtDur(r.P99), fmtDur(r.Max), fmtDur(r.CommitP50)})
		}
		t.write(stdout)
		return nil
	})
}

func wakeSamples(ctx context.Context, a, b *receipts.DB, n int) (wakeResult, error) {
	run := workload.RunID()
	var lat, commits []time.Duration
	for i := range n {
		k := workload.NewKey(run, 0, uint64(i))
		key := receipts.Key{Scope: k.Scope, ID: k.ID}
		fp := workload.Fingerprint(k)
		l, _, err := a.Claim(ctx, key, fp)
		if err != nil {
			return wakeResult{}, err
		}
		if l == nil {
			return wakeResult{}, errors.New("a new key was not granted")
		}
		done := make(chan error, 1)
		var returned atomic.Int64
		go func() {
			r, err := b.Do(ctx, key, fp, func(context.Context, *receipts.Lease) ([]byte, error) {
				return nil, receipts.NotPerformed(errors.New("node B ran the effect: it did not wait"))
			})
			returned.Store(time.Now().UnixNano())
			if err == nil && r.State != receipts.Succeeded {
				err = fmt.Errorf("node B got a %s receipt", r.State)
			}
			done <- err
		}()
		time.Sleep(20 * time.Millisecond) // B is waiting now; A's notifier is idle
		t0 := time.Now()
		if _, err := l.Commit(ctx, workload.ResultFor(k)); err != nil {
			return wakeResult{}, err
		}
		commits = append(commits, time.Since(t0))
		select {
		case err := <-done:
			if err != nil {
				return wakeResult{}, err
			}
		case <-time.After(10 * time.Second):
			return wakeResult{}, errors.New("node B was not woken within 10s")
		}
		lat = append(lat, time.Duration(returned.Load()-t0.UnixNano()))
	}
	slices.Sort(lat)
	slices.Sort(commits)
	q := func(s []time.Duration, p float64) time.Duration { return s[min(len(s)-1, int(float64(len(s))*p))] }
	return wakeResult{Samples: n, P50: q(lat, 0.5), P99: q(lat, 0.99), Max: lat[len(lat)-1], CommitP50: q(commits, 0.5)}, nil
}

func writeJSONValue(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
