package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/examples/internal/exampledb"
)

// errNoItem is returned by items.get for an item the caller does not have.
var errNoItem = errors.New("no such work item")

// items is where the service keeps work items: the receipts store's own
// database, so that an item commits with the receipt of the response that
// created it (Attempt.Stage), in one Pebble batch or one PostgreSQL
// transaction. The Pebble kind (items_pebble.go) is left out of a build
// with -tags receipts_nopebble, which links no Pebble (items_nopebble.go).
type items interface {
	// put is the effect that writes item, created by who.
	put(who string, item WorkItem) (receipts.Effect, error)
	// get reads who's item id: errNoItem if there is none.
	get(ctx context.Context, who, id string) (*WorkItem, error)
	// list reads who's items, oldest first.
	list(ctx context.Context, who string) ([]WorkItem, error)
}

// pgItems keeps the items in a table of the store's PostgreSQL schema:
// work_items, one row per item, inserted in the transaction that writes
// the receipt.
type pgItems struct {
	pool  *pgxpool.Pool
	table string // schema-qualified, quoted
}

// newPGItems creates the work_items table in schema if it is not there, under
// an advisory lock (exampledb.CreateObjects): replicas may start at once.
func newPGItems(ctx context.Context, pool *pgxpool.Pool, schema string) (*pgItems, error) {
	p := &pgItems{pool: pool, table: pgx.Identifier{schema, "work_items"}.Sanitize()}
	err := exampledb.CreateObjects(ctx, pool, schema, `CREATE TABLE IF NOT EXISTS `+p.table+` (
		created_by text NOT NULL,
		id         text NOT NULL,
		item       jsonb NOT NULL,
		created_at timestamptz NOT NULL,
		PRIMARY KEY (created_by, id))`)
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", p.table, err)
	}
	return p, nil
}

func (p *pgItems) put(who string, item WorkItem) (receipts.Effect, error) {
	value, err := json.Marshal(item)
	if err != nil {
		return nil, err
	}
	return receipts.EffectOn(func(ctx context.Context, tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+p.table+` (created_by, id, item, created_at) VALUES ($1, $2, $3, $4)`,
			who, item.ID, value, item.CreatedAt)
		return err
	}), nil
}

func (p *pgItems) get(ctx context.Context, who, id string) (*WorkItem, error) {
	var item WorkItem
	err := p.pool.QueryRow(ctx, `SELECT item FROM `+p.table+` WHERE created_by = $1 AND id = $2`, who, id).Scan(&item)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, errNoItem
	}
	if err != nil {
		return nil, err
	}
	return &item, nil
}

func (p *pgItems) list(ctx context.Context, who string) ([]WorkItem, error) {
	rows, err := p.pool.Query(ctx, `SELECT item FROM `+p.table+` WHERE created_by = $1 ORDER BY created_at, id`, who)
	if err != nil {
		return nil, err
	}
	items, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkItem, error) {
		var item WorkItem
		err := r.Scan(&item)
		return item, err
	})
	if items == nil {
		items = []WorkItem{}
	}
	return items, err
}
