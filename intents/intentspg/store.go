// Package intentspg keeps an intents.Journal in PostgreSQL, for a host that
// already runs one: a table of actions in a schema of its own (default
// "intents"), through a pgx pool.
//
//	pool, _ := pgxpool.New(ctx, dsn)
//	journal, err := intentspg.Open(ctx, pool, nil)
//
// Schema (format 1, created by Open, checked by later opens):
//
//   - meta: one row, the format.
//   - actions: one row per action: key (primary key), ref (unique, NULL
//     when none), state (the intents.State number), target, operation,
//     arguments (json, as approved), approved_by, approved_at, deadline,
//     attempts, last_error, answer (jsonb: intents.Answer as JSON),
//     updated_at, holder and lease_until (the delivery lease: the host
//     that delivers the action, empty when none, and until when),
//     uncertain_step (intents.Action.UncertainStep, empty when none); an
//     index on (state, key) serves List.
//
// holder and lease_until came after format 1's first release, and
// uncertain_step after them. Open adds them to a journal that lacks them (ALTER TABLE ... ADD COLUMN, under the
// same advisory lock as the creation, so that hosts starting at once
// neither race nor fail), and the format stays 1: a version before them
// reads and writes the table as before, and delivers without leases.
//
// The table is the host's own data: it keeps each request, and the
// answers, in the clear. Times are kept to the microsecond.
//
// Every write is one transaction, committed before it returns (a write
// without sync, the attempt counts, commits with synchronous_commit off:
// a server crash may lose it, never part of it). Update reads the row FOR
// UPDATE, so writes of one action on several hosts are serialized. Several
// hosts may share the table; see intents.Dispatcher.
package intentspg

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"iter"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/receiptstore/receipts/intents"
)

// DefaultSchema is Options.Schema's default.
const DefaultSchema = "intents"

// format is the schema format this version writes and reads.
const format = 1

// Options configures Open.
type Options struct {
	// Schema holds the journal's tables: [a-z_][a-z0-9_]*, at most 40
	// bytes. Default DefaultSchema. Keep it apart from a receipts store's
	// schema.
	Schema string
	// Journal are the Journal's options (Options.Pebble is ignored).
	Journal *intents.Options
}

var schemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,39}$`)

// Open opens the journal in opts.Schema of pool's database, creating the
// schema and its tables if needed. The pool stays the caller's: the
// journal's Close does not close it.
func Open(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*intents.Journal, error) {
	s, err := newStore(ctx, pool, opts)
	if err != nil {
		return nil, err
	}
	var jo *intents.Options
	if opts != nil {
		jo = opts.Journal
	}
	return intents.New(s, jo)
}

// NewStore opens the store in opts.Schema of pool's database (creating it
// if needed), for intents.New: Open is intents.New(NewStore(...),
// opts.Journal).
func NewStore(ctx context.Context, pool *pgxpool.Pool, opts *Options) (intents.Store, error) {
	return newStore(ctx, pool, opts)
}

func newStore(ctx context.Context, pool *pgxpool.Pool, opts *Options) (*store, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: intentspg: Open needs a pool", intents.ErrInvalid)
	}
	schema := DefaultSchema
	if opts != nil && opts.Schema != "" {
		schema = opts.Schema
	}
	if !schemaRE.MatchString(schema) {
		return nil, fmt.Errorf("%w: intentspg: schema %q: want [a-z_][a-z0-9_]*, at most 40 bytes", intents.ErrInvalid, schema)
	}
	s := &store{pool: pool, schema: pgx.Identifier{schema}.Sanitize()}
	var err error
	for range 5 {
		// Concurrent first opens: the loser's catalog snapshot may predate
		// the winner's tables; a new transaction sees them.
		if err = s.migrate(ctx, schema); err == nil || !raced(err) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		if errors.Is(err, intents.ErrUnknownFormat) {
			return nil, err
		}
		return nil, fmt.Errorf("intentspg: open schema %s: %w", schema, err)
	}
	return s, nil
}

func raced(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return false
	}
	switch pe.Code {
	case "42P07", "23505", "42P06", "42P01", "42710":
		return true
	}
	return false
}

func (s *store) migrate(ctx context.Context, schema string) error {
	h := fnv.New32a()
	h.Write([]byte("intents:" + schema))
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1::int4)", int32(h.Sum32())); err != nil {
			return err
		}
		var exists bool
		if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relname = 'meta')`, schema).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			for _, q := range []string{
				`CREATE SCHEMA IF NOT EXISTS ` + s.schema,
				`CREATE TABLE ` + s.schema + `.meta (format int NOT NULL)`,
				`INSERT INTO ` + s.schema + `.meta (format) VALUES (1)`,
				`CREATE TABLE ` + s.schema + `.actions (
	key         text PRIMARY KEY,
	ref         text UNIQUE,
	state       smallint NOT NULL CHECK (state BETWEEN 1 AND 6),
	target      text NOT NULL,
	operation   text NOT NULL,
	arguments   json NOT NULL,
	approved_by text NOT NULL,
	approved_at timestamptz NOT NULL,
	deadline    timestamptz NOT NULL,
	attempts    bigint NOT NULL DEFAULT 0,
	last_error  text NOT NULL DEFAULT '',
	answer      jsonb,
	updated_at  timestamptz NOT NULL,
	holder      text NOT NULL DEFAULT '',
	lease_until timestamptz,
	uncertain_step text NOT NULL DEFAULT '')`,
				`CREATE INDEX actions_state ON ` + s.schema + `.actions (state, key)`,
			} {
				if _, err := tx.Exec(ctx, q); err != nil {
					return err
				}
			}
			return nil
		}
		var f int
		if err := tx.QueryRow(ctx, `SELECT format FROM `+s.schema+`.meta`).Scan(&f); err != nil {
			return err
		}
		if f != format {
			return fmt.Errorf("%w: schema %s has format %d (this version reads %d)", intents.ErrUnknownFormat, schema, f, format)
		}
		// A journal made before delivery leases: add their columns; one made
		// before Action.UncertainStep: add its column.
		if err := s.addColumns(ctx, tx, schema, "lease_until", `ADD COLUMN IF NOT EXISTS holder text NOT NULL DEFAULT '',
 ADD COLUMN IF NOT EXISTS lease_until timestamptz`); err != nil {
			return fmt.Errorf("add the delivery lease columns: %w", err)
		}
		if err := s.addColumns(ctx, tx, schema, "uncertain_step", `ADD COLUMN IF NOT EXISTS uncertain_step text NOT NULL DEFAULT ''`); err != nil {
			return fmt.Errorf("add the uncertain_step column: %w", err)
		}
		return nil
	})
}

// store is the PostgreSQL intents.Store.
type store struct {
	pool   *pgxpool.Pool
	schema string // quoted
}

const columns = `key, ref, state, target, operation, arguments, approved_by, approved_at, deadline, attempts, last_error, answer, updated_at, holder, lease_until, uncertain_step`

func (s *store) Close() error { return nil }

// scan reads one row of columns.
func scan(row pgx.Row) (*intents.Action, error) {
	var (
		a        intents.Action
		ref      *string
		state    int16
		args     []byte
		attempts int64
		answer   []byte
		until    *time.Time
	)
	err := row.Scan(&a.Key, &ref, &state, &a.Target, &a.Operation, &args, &a.ApprovedBy, &a.ApprovedAt, &a.Deadline,
		&attempts, &a.LastError, &answer, &a.UpdatedAt, &a.Holder, &until, &a.UncertainStep)
	if err != nil {
		return nil, err
	}
	if until != nil {
		a.LeaseUntil = *until
	}
	if ref != nil {
		a.Ref = *ref
	}
	a.State = intents.State(state)
	a.Arguments = json.RawMessage(args)
	a.Attempts = uint32(attempts)
	if answer != nil {
		var ans intents.Answer
		if err := json.Unmarshal(answer, &ans); err != nil {
			return nil, fmt.Errorf("%w: answer of %s: %w", intents.ErrCorrupt, a.Key, err)
		}
		a.Answer = &ans
	}
	return &a, nil
}

// row is a's column values, in the order of columns.
func row(a *intents.Action) ([]any, error) {
	var ref *string
	if a.Ref != "" {
		ref = &a.Ref
	}
	var answer []byte
	if a.Answer != nil {
		b, err := json.Marshal(a.Answer)
		if err != nil {
			return nil, fmt.Errorf("intentspg: encode the answer of %s: %w", a.Key, err)
		}
		answer = b
	}
	var until *time.Time
	if !a.LeaseUntil.IsZero() {
		until = &a.LeaseUntil
	}
	return []any{a.Key, ref, int16(a.State), a.Target, a.Operation, string(a.Arguments), a.ApprovedBy,
		a.ApprovedAt, a.Deadline, int64(a.Attempts), a.LastError, answer, a.UpdatedAt, a.Holder, until, a.UncertainStep}, nil
}

// micro truncates a's times to what timestamptz keeps.
func micro(a *intents.Action) {
	a.ApprovedAt = a.ApprovedAt.Truncate(time.Microsecond)
	a.Deadline = a.Deadline.Truncate(time.Microsecond)
	a.UpdatedAt = a.UpdatedAt.Truncate(time.Microsecond)
	a.LeaseUntil = a.LeaseUntil.Truncate(time.Microsecond)
	if a.Answer != nil {
		a.Answer.At = a.Answer.At.Truncate(time.Microsecond)
	}
}

func (s *store) Create(ctx context.Context, a *intents.Action) (*intents.Action, bool, error) {
	c := *a
	micro(&c)
	vals, err := row(&c)
	if err != nil {
		return nil, false, err
	}
	for range 3 {
		tag, err := s.pool.Exec(ctx, `INSERT INTO `+s.schema+`.actions (`+columns+`)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16) ON CONFLICT (ref) DO NOTHING`, vals...)
		if err != nil {
			return nil, false, fmt.Errorf("intentspg: insert %s: %w", a.Key, err)
		}
		if tag.RowsAffected() == 1 {
			return &c, true, nil
		}
		stored, err := scan(s.pool.QueryRow(ctx, `SELECT `+columns+` FROM `+s.schema+`.actions WHERE ref = $1`, a.Ref))
		if errors.Is(err, pgx.ErrNoRows) {
			continue // forgotten meanwhile: the ref is free
		}
		if err != nil {
			return nil, false, fmt.Errorf("intentspg: read ref: %w", err)
		}
		return stored, false, nil
	}
	return nil, false, fmt.Errorf("intentspg: ref %q keeps changing", a.Ref)
}

func states(set []intents.State) []int16 {
	out := make([]int16, len(set))
	for i, s := range set {
		out[i] = int16(s)
	}
	return out
}

func (s *store) Update(ctx context.Context, key string, from []intents.State, sync bool, change func(*intents.Action) error) (*intents.Action, error) {
	var out *intents.Action
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if !sync {
			if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
				return err
			}
		}
		old, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM `+s.schema+`.actions WHERE key = $1 FOR UPDATE`, key))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("%w: %s", intents.ErrNotFound, key)
		}
		if err != nil {
			return err
		}
		if !intents.StateIn(old.State, from) {
			return fmt.Errorf("%w: %s is %v", intents.ErrWrongState, key, old.State)
		}
		a := *old
		if old.Answer != nil {
			ans := *old.Answer
			a.Answer = &ans
		}
		if err := change(&a); err != nil {
			return err
		}
		if a.Key != old.Key || a.Ref != old.Ref || a.State < intents.Approved || a.State > intents.Uncertain {
			return fmt.Errorf("intentspg: change of %s made an invalid action", key)
		}
		micro(&a)
		vals, err := row(&a)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `UPDATE `+s.schema+`.actions SET state = $3, target = $4, operation = $5, arguments = $6,
 approved_by = $7, approved_at = $8, deadline = $9, attempts = $10, last_error = $11, answer = $12, updated_at = $13,
 holder = $14, lease_until = $15, uncertain_step = $16
 WHERE key = $1 AND ref IS NOT DISTINCT FROM $2`, vals...); err != nil {
			return err
		}
		out = &a
		return nil
	})
	if err != nil {
		if errors.Is(err, intents.ErrNotFound) || errors.Is(err, intents.ErrWrongState) || errors.Is(err, intents.ErrCorrupt) {
			return nil, err
		}
		return nil, fmt.Errorf("intentspg: update %s: %w", key, err)
	}
	return out, nil
}

func (s *store) Get(ctx context.Context, key string) (*intents.Action, error) {
	a, err := scan(s.pool.QueryRow(ctx, `SELECT `+columns+` FROM `+s.schema+`.actions WHERE key = $1`, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w: %s", intents.ErrNotFound, key)
	}
	if err != nil && !errors.Is(err, intents.ErrCorrupt) {
		return nil, fmt.Errorf("intentspg: read %s: %w", key, err)
	}
	return a, err
}

// listPage is how many rows List reads per query.
const listPage = 500

func (s *store) List(ctx context.Context, state intents.State) iter.Seq2[*intents.Action, error] {
	return func(yield func(*intents.Action, error) bool) {
		after := ""
		for {
			var rows pgx.Rows
			var err error
			if state == 0 {
				rows, err = s.pool.Query(ctx, `SELECT `+columns+` FROM `+s.schema+`.actions WHERE key > $1 ORDER BY key LIMIT $2`, after, listPage)
			} else {
				rows, err = s.pool.Query(ctx, `SELECT `+columns+` FROM `+s.schema+`.actions WHERE state = $1 AND key > $2 ORDER BY key LIMIT $3`, int16(state), after, listPage)
			}
			if err != nil {
				yield(nil, fmt.Errorf("intentspg: list: %w", err))
				return
			}
			var page []*intents.Action
			for rows.Next() {
				a, err := scan(rows)
				if err != nil {
					rows.Close()
					yield(nil, fmt.Errorf("intentspg: list: %w", err))
					return
				}
				page = append(page, a)
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				yield(nil, fmt.Errorf("intentspg: list: %w", err))
				return
			}
			for _, a := range page {
				if !yield(a, nil) {
					return
				}
			}
			if len(page) < listPage {
				return
			}
			after = page[len(page)-1].Key
		}
	}
}

func (s *store) Delete(ctx context.Context, key string, from []intents.State) error {
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.schema+`.actions WHERE key = $1 AND state = ANY($2)`, key, states(from))
	if err != nil {
		return fmt.Errorf("intentspg: delete %s: %w", key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	var st int16
	err = s.pool.QueryRow(ctx, `SELECT state FROM `+s.schema+`.actions WHERE key = $1`, key).Scan(&st)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: %s", intents.ErrNotFound, key)
	}
	if err != nil {
		return fmt.Errorf("intentspg: delete %s: %w", key, err)
	}
	return fmt.Errorf("%w: %s is %v", intents.ErrWrongState, key, intents.State(st))
}

// addColumns alters the actions table of schema (unquoted) with add (ADD COLUMN clauses)
// unless it has column already. The column is looked up first, so that an open of a current journal takes no lock
// on the table (ALTER TABLE would, even with nothing to add).
func (s *store) addColumns(ctx context.Context, tx pgx.Tx, schema, column, add string) error {
	var has bool
	if err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
 JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relname = 'actions' AND a.attname = $2 AND NOT a.attisdropped)`, schema, column).Scan(&has); err != nil {
		return err
	}
	if has {
		return nil
	}
	_, err := tx.Exec(ctx, `ALTER TABLE `+s.schema+`.actions `+add)
	return err
}
