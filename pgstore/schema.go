package pgstore

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
)

// schemaLock is the advisory lock (class lockClass) that serializes DDL on one schema:
// creation, migration, partition creation.
func schemaLock(schema string) int32 {
	h := fnv.New32a()
	h.Write([]byte("schema:" + schema))
	return int32(h.Sum32())
}

// migrate creates the schema (format formatVersion) if it has no meta table, or checks the
// stored format; it refuses a format it does not know. It loads the epoch width and the secret,
// takes the recorded Retention and LeaseTTL for the options left zero, checks the settings in
// force (Check) and records them in meta (a later open with other values updates them, as on
// Pebble).
func (e *engine) migrate(ctx context.Context) error {
	var err error
	for attempt := 0; attempt < 5; attempt++ {
		// Concurrent first opens: the loser waits on the lock, but the catalog snapshot it
		// took before the wait may not show the winner's tables; a new transaction does.
		if err = e.migrateOnce(ctx); err == nil || !migrateRaced(err) {
			break
		}
		if err := sleep(ctx, 10*time.Millisecond); err != nil {
			return err
		}
	}
	if err != nil {
		if errors.Is(err, receipts.ErrUnknownFormat) || errors.Is(err, receipts.ErrCorrupt) {
			return err
		}

		return errorf("pgstore: open schema %s: %w", e.o.Schema, err)
	}
	return nil
}

// migrateRaced: duplicate or undefined object, as seen by a transaction that started before
// another session's creation committed.
func migrateRaced(err error) bool {
	switch pgCode(err) {
	case "42P07", "23505", "42P06", "42P01", "42710":
		return true
	}
	return false
}

func (e *engine) migrateOnce(ctx context.Context) error {
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1::int4, $2::int4)", lockClass, schemaLock(e.o.Schema)); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relname = 'meta')`, e.o.Schema).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			for _, s := range schemaSQL(e.o.Schema) {
				if _, err := tx.Exec(ctx, s); err != nil {
					return fmt.Errorf("create schema: %w", err)
				}
			}
			secret := make([]byte, 32)
			_, _ = rand.Read(secret)
			w := e.o.EpochWidth.Microseconds()
			if _, err := tx.Exec(ctx, `INSERT INTO `+e.q.schema+`.meta (format, epoch_width_us, retention_us, lease_ttl_us, secret, created_at, marker_width_us)
VALUES ($1, $2, $3, $4, $5, `+e.q.clock("$6")+`, $7)`,
				formatVersion, w, e.retentionUS(), e.o.LeaseTTL.Microseconds(), secret, e.nowArg(), e.newMarkerWidth(w)); err != nil {
				return fmt.Errorf("create meta: %w", err)
			}
		}
		var format int
		if err := tx.QueryRow(ctx, `SELECT format FROM `+e.q.schema+`.meta`).Scan(&format); err != nil {
			if errors.Is(err, pgx.ErrNoRows) {
				return fmt.Errorf("%w: schema %s has an empty meta table", receipts.ErrCorrupt, e.o.Schema)
			}
			return fmt.Errorf("read meta: %w", err)
		}
		if format < 1 || format > formatVersion {
			return fmt.Errorf("%w: schema %s has format %d, this version reads formats 1 to %d", receipts.ErrUnknownFormat, e.o.Schema, format, formatVersion)
		}
		var retUS, ttlUS int64
		var winUS *int64 // format 1 records no window
		cols := `NULL::bigint, 0::bigint`
		if format >= 2 {
			cols = `tombstone_window_us, marker_width_us`
		}
		if err := tx.QueryRow(ctx, `SELECT epoch_width_us, retention_us, lease_ttl_us, secret, `+cols+` FROM `+e.q.schema+`.meta`).Scan(
			&e.width, &retUS, &ttlUS, &e.secret, &winUS, &e.mwidth); err != nil {
			return fmt.Errorf("read meta: %w", err)
		}
		if e.width <= 0 {
			return fmt.Errorf("%w: schema %s: epoch width %d µs", receipts.ErrCorrupt, e.o.Schema, e.width)
		}
		if format >= 2 && (e.mwidth < e.width || e.mwidth%e.width != 0) {
			return fmt.Errorf("%w: schema %s: markers partition width %d µs (epoch width %d µs)", receipts.ErrCorrupt, e.o.Schema, e.mwidth, e.width)
		}
		// the recorded values for the options left zero, then the settings in force checked
		// before anything is written (a refused open leaves the schema as it is)
		if e.o.StoredRetention && retUS > 0 {
			e.o.Retention = time.Duration(retUS) * time.Microsecond
		}
		if e.o.StoredLeaseTTL && ttlUS > 0 {
			e.o.LeaseTTL = time.Duration(ttlUS) * time.Microsecond
		}
		if e.o.TombstoneWindow == 0 || e.o.StoredTombstoneWindow {
			if winUS != nil && *winUS != 0 {
				e.o.TombstoneWindow = time.Duration(*winUS) * time.Microsecond
			} else {
				e.o.TombstoneWindow = driver.DefaultTombstoneWindow(e.o.Retention)
			}
		}
		if e.o.TombstoneWindow < 0 {
			e.o.TombstoneWindow = -1
		}
		if e.o.Check != nil {
			if err := e.o.Check(e.Config()); err != nil {
				return fmt.Errorf("settings in force: %w", err)
			}
		}
		if format == 1 {
			e.mwidth = e.newMarkerWidth(e.width)
			if err := e.migrate1(ctx, tx); err != nil {
				return fmt.Errorf("migrate format 1 to %d: %w", formatVersion, err)
			}
		}
		if format == 2 || format == 3 {
			// format 3 changes no table: its GC writes the markers of the records it drops,
			// and a format-2 binary, which would drop them without, must refuse the store;
			// the markers format 2 wrote beside every record stay in force. Format 4 adds
			// the journal column (below), which a format-3 binary must not ignore.
			if _, err := tx.Exec(ctx, `UPDATE `+e.q.schema+`.meta SET format = $1`, formatVersion); err != nil {
				return fmt.Errorf("migrate format %d to %d: %w", format, formatVersion, err)
			}
		}
		if err := e.addJournal(ctx, tx); err != nil { // formats 1 to 3
			return fmt.Errorf("add the step journal column: %w", err)
		}
		if err := e.loadClock(ctx, tx); err != nil {
			return err
		}
		for _, s := range append(append(privacySQL(e.q.schema), claimScopeSQL(e.q.schema)...), e.q.freshFnDDL, e.q.freshManyFnDDL) {
			if _, err := tx.Exec(ctx, s); err != nil {
				return fmt.Errorf("create the privacy tables: %w", err)
			}
		}
		_, err := tx.Exec(ctx, `UPDATE `+e.q.schema+`.meta SET retention_us = $1, lease_ttl_us = $2, tombstone_window_us = $3
 WHERE retention_us <> $1 OR lease_ttl_us <> $2 OR tombstone_window_us IS DISTINCT FROM $3`, e.retentionUS(), e.o.LeaseTTL.Microseconds(), e.windowUS())
		return err
	})
}

// migrate1 brings a format-1 schema to format 3 (and Open then to 4) (in the open's transaction, under the schema
// lock): meta records the tombstone window, records get the reserved meta column, and the
// markers family is created with a partition beside every records partition; with
// tombstones on, every record gets its marker (as on Pebble: receipts written before the
// upgrade are protected too, though their records would be until GC drops them). Older
// versions refuse format 3.
func (e *engine) migrate1(ctx context.Context, tx pgx.Tx) error {
	stmts := []string{
		`ALTER TABLE ` + e.q.schema + `.meta ADD COLUMN IF NOT EXISTS tombstone_window_us bigint`,
		`ALTER TABLE ` + e.q.schema + `.meta ADD COLUMN IF NOT EXISTS marker_width_us bigint NOT NULL DEFAULT ` + strconv.FormatInt(e.mwidth, 10),
		`ALTER TABLE ` + e.q.schema + `.records ADD COLUMN IF NOT EXISTS meta bytea`,
		markersSQL(e.q.schema),
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return err
		}
	}
	rows, err := tx.Query(ctx, `SELECT c.relname FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_inherits i ON i.inhrelid = c.oid
 WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname ~ '^records_e-?[0-9]+$' AND NOT i.inhdetachpending`, e.o.Schema)
	if err != nil {
		return err
	}
	var epochs []int64
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return err
		}
		if ep, err := strconv.ParseInt(strings.TrimPrefix(name, "records_e"), 10, 64); err == nil {
			epochs = append(epochs, ep)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	done := map[int64]bool{}
	for _, ep := range epochs {
		if m := e.markerEpoch(ep); !done[m] {
			done[m] = true
			if err := e.createPartition(ctx, tx, famMarkers, m); err != nil {
				return err
			}
		}
	}
	if e.tombs() {
		if _, err := tx.Exec(ctx, `INSERT INTO `+e.q.schema+`.markers (scope, id, epoch, used_at)
SELECT scope, id, `+markerEpochSQL("epoch", e.mwidth/e.width)+`, updated_at FROM `+e.q.schema+`.records ON CONFLICT DO NOTHING`); err != nil {
			return err
		}
	}
	_, err = tx.Exec(ctx, `UPDATE `+e.q.schema+`.meta SET format = $1`, formatVersion)
	return err
}

// loadClock starts the engine's time high-water mark from meta.clock, adding the column to a
// schema created before it existed (format 1 without it: older versions read meta by column
// name, so they still read the schema).
func (e *engine) loadClock(ctx context.Context, tx pgx.Tx) error {
	var has bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relname = 'meta' AND a.attname = 'clock' AND NOT a.attisdropped)`, e.o.Schema).Scan(&has); err != nil {
		return fmt.Errorf("read meta: %w", err)
	}
	if !has {
		if _, err := tx.Exec(ctx, `ALTER TABLE `+e.q.schema+`.meta ADD COLUMN IF NOT EXISTS clock timestamptz`); err != nil {
			return fmt.Errorf("add meta.clock: %w", err)
		}
	}
	var clock *time.Time
	if err := tx.QueryRow(ctx, `SELECT clock FROM `+e.q.schema+`.meta`).Scan(&clock); err != nil {
		return fmt.Errorf("read meta: %w", err)
	}
	if clock != nil {
		e.raise(clock.UnixNano())
	}
	return nil
}

// loadClockFromRecords raises the engine's time high-water mark to the start of the newest
// partition holding records: every record was written at or after the start of its epoch, so
// the store has used that time even if no Close or GC pass recorded it in meta (a crash).
// Cost: one probe of an empty table per partition created ahead, then one row read.
func (e *engine) loadClockFromRecords(ctx context.Context) error {
	parts, err := e.partitions(ctx)
	if err != nil {
		return errorf("pgstore: open: list partitions: %w", err)
	}
	slices.SortFunc(parts, func(a, b partition) int { return cmp.Compare(a.epoch, b.epoch) })
	for i := len(parts) - 1; i >= 0; i-- {
		p := parts[i]
		if p.family != famRecords || !p.attached || p.pending || time.UnixMicro(p.epoch*e.width).UnixNano() <= e.hwm.Load() {
			continue
		}
		var held bool
		if err := e.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM `+e.q.schema+`.`+pgx.Identifier{p.name}.Sanitize()+`)`).Scan(&held); err != nil {
			return errorf("pgstore: open: probe %s: %w", p.name, err)
		}
		if held {
			e.raise(time.UnixMicro(p.epoch * e.width).UnixNano())
			return nil
		}
	}
	return nil
}

// The partitioned tables ("families"): records, and the tombstone markers beside them. Every
// epoch has a partition of each (created together), so a write that lands in an epoch finds
// both.
const (
	famRecords = "records"
	famMarkers = "markers"
)

var families = [...]string{famRecords, famMarkers}

func partName(family string, epoch int64) string {
	return family + "_e" + strconv.FormatInt(epoch, 10)
}

// ensurePartition creates and attaches the partitions of epoch (records and markers) that are
// missing. It is idempotent and safe to run on many nodes at once (the schema lock serializes
// it). A partition is created standalone and then attached: ATTACH takes SHARE UPDATE
// EXCLUSIVE on the parent, which does not block claims and commits (CREATE TABLE .. PARTITION
// OF would take ACCESS EXCLUSIVE); an empty table needs no validation scan.
func (e *engine) ensurePartition(ctx context.Context, epoch int64) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		if err = e.ensurePartitionOnce(ctx, epoch); err == nil || !raced(err) {
			break
		}
	}
	if err != nil {
		return errorf("pgstore: create partition %s: %w", partName(famRecords, epoch), err)
	}
	return nil
}

// raced: another session created the table first.
func raced(err error) bool { c := pgCode(err); return c == "42P07" || c == "23505" }

// partState reads whether a family's partition of an epoch exists and is attached. The catalog
// is read with SQL (a fresh snapshot per statement), not to_regclass: the relation cache is not
// refreshed by waiting on an advisory lock, so it could still miss a table another session
// created meanwhile.
const partState = `SELECT coalesce(bool_or(i.inhrelid IS NOT NULL AND NOT i.inhdetachpending), false), count(c.oid) > 0
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
 WHERE n.nspname = $1 AND c.relname = $2`

func (e *engine) ensurePartitionOnce(ctx context.Context, epoch int64) error {
	return pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		missing := false
		for _, fam := range families {
			var attached, exists bool
			if err := tx.QueryRow(ctx, partState, e.o.Schema, partName(fam, e.famEpoch(fam, epoch))).Scan(&attached, &exists); err != nil {
				return err
			}
			missing = missing || !attached
		}
		if !missing {
			return nil
		}
		if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '10s'"); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1::int4, $2::int4)", lockClass, schemaLock(e.o.Schema)); err != nil {
			return err
		}
		for _, fam := range families {
			if err := e.createPartition(ctx, tx, fam, e.famEpoch(fam, epoch)); err != nil {
				return err
			}
		}
		return nil
	})
}

// famEpoch is the epoch of family's partition holding records epoch ep: ep itself, or the
// markers partition's (markerEpoch).
func (e *engine) famEpoch(family string, ep int64) int64 {
	if family == famMarkers {
		return e.markerEpoch(ep)
	}
	return ep
}

// markerEpoch is the markers partition holding the markers written in records epoch ep: a
// markers partition spans mwidth/width records epochs (newMarkerWidth).
func (e *engine) markerEpoch(ep int64) int64 { return floorDiv(ep, e.mwidth/e.width) }

// markerEpochSQL is the SQL of markerEpoch of the records epoch column col, k records epochs
// to a markers partition.
func markerEpochSQL(col string, k int64) string {
	if k == 1 {
		return col
	}
	return `floor(` + col + `::numeric / ` + strconv.FormatInt(k, 10) + `)::bigint`
}

// newMarkerWidth is the markers partition width (µs) of a schema being created (or migrated)
// with records epochs of width µs: a whole number of epochs, about a quarter of Retention +
// TombstoneWindow (the default window if tombstones are off now: they may be turned on
// later), so that a claim probes about five markers partitions, not the 30-odd epochs the
// window spans (each probe an index lookup, and a lock: past 16 relations a transaction's
// locks leave the fast path). GC then drops a markers partition up to a quarter window late.
func (e *engine) newMarkerWidth(width int64) int64 {
	win := e.o.TombstoneWindow
	if win <= 0 {
		win = driver.DefaultTombstoneWindow(e.o.Retention)
	}
	k := max((e.o.Retention+win).Microseconds()/(4*width), 1)
	return k * width
}

// createPartition creates and attaches family's partition of epoch in tx (which holds the
// schema lock), unless it is attached already.
func (e *engine) createPartition(ctx context.Context, tx pgx.Tx, family string, epoch int64) error {
	name := partName(family, epoch)
	var attached, exists bool
	if err := tx.QueryRow(ctx, partState, e.o.Schema, name).Scan(&attached, &exists); err != nil || attached {
		return err
	}
	if exists {
		// a detached leftover of a dead epoch, or a pending detach: GC's business
		return fmt.Errorf("partition %s exists but is not attached", name)
	}
	qn := e.q.schema + "." + pgx.Identifier{name}.Sanitize()
	parent := e.q.schema + "." + family
	fill := ""
	if family == famRecords {
		fill = ` WITH (fillfactor = 90)`
	}
	stmts := []string{
		`CREATE TABLE ` + qn + ` (LIKE ` + parent + ` INCLUDING DEFAULTS)` + fill,
		`ALTER TABLE ` + parent + ` ATTACH PARTITION ` + qn + ` FOR VALUES FROM (` +
			strconv.FormatInt(epoch, 10) + `) TO (` + strconv.FormatInt(epoch+1, 10) + `)`,
	}
	for _, s := range stmts {
		if _, err := tx.Exec(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

// partition is one table of a partitioned family as GC sees it.
type partition struct {
	family   string // famRecords or famMarkers
	name     string
	epoch    int64
	attached bool
	pending  bool // DETACH CONCURRENTLY was interrupted: FINALIZE it
	bytes    int64
}

// partitions lists the partitions of both families (records first, then markers, each in
// name order).
func (e *engine) partitions(ctx context.Context) ([]partition, error) {
	rows, err := e.pool.Query(ctx, `SELECT c.relname, i.inhrelid IS NOT NULL, coalesce(i.inhdetachpending, false),
       pg_total_relation_size(c.oid)
  FROM pg_class c
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_inherits i ON i.inhrelid = c.oid
 WHERE n.nspname = $1 AND c.relkind = 'r' AND c.relname ~ '^(records|markers)_e-?[0-9]+$'
 ORDER BY c.relname ~ '^markers', c.relname`, e.o.Schema)
	if err != nil {
		return nil, err
	}
	var out []partition
	for rows.Next() {
		var p partition
		if err := rows.Scan(&p.name, &p.attached, &p.pending, &p.bytes); err != nil {
			return nil, err
		}
		p.family, _, _ = strings.Cut(p.name, "_e")
		p.epoch, err = strconv.ParseInt(strings.TrimPrefix(p.name, p.family+"_e"), 10, 64)
		if err != nil {
			continue
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// epochEnd is when epoch ends.
func (e *engine) epochEnd(epoch int64) time.Time { return time.UnixMicro((epoch + 1) * e.width) }

// partEnd is when partition p's epoch ends (a markers partition spans mwidth).
func (e *engine) partEnd(p partition) time.Time {
	if p.family == famMarkers {
		return time.UnixMicro((p.epoch + 1) * e.mwidth)
	}
	return e.epochEnd(p.epoch)
}

// addJournal adds the step journal column (steps.go) to a schema created before it, in the
// open's transaction: a catalog read first, so that opening a schema that has it takes no
// lock on the records table.
func (e *engine) addJournal(ctx context.Context, tx pgx.Tx) error {
	var has bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relname = 'records' AND a.attname = 'journal' AND NOT a.attisdropped)`, e.o.Schema).Scan(&has); err != nil || has {
		return err
	}
	_, err := tx.Exec(ctx, `ALTER TABLE `+e.q.schema+`.records ADD COLUMN IF NOT EXISTS journal bytea`)
	return err
}
