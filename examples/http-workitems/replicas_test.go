package main

import (
	"context"
	"testing"

	"github.com/receiptstore/receipts/examples/internal/exampledb"
	"github.com/receiptstore/receipts/internal/pgtest"
)

// Several replicas of the service started at the same moment on an empty database (here an
// empty schema), each with its own pool, as `http-workitems -pg DSN` started N times: every
// one opens the store and creates the work_items table, and every one starts. Concurrent
// CREATE TABLE IF NOT EXISTS is not safe in PostgreSQL (each can pass the existence check,
// then one fails on the catalog's unique index): on the code before, a replica died with
// `create "…"."work_items": ERROR: duplicate key value violates unique constraint
// "pg_type_typname_nsp_index"` (issue 43, item 4). The creation now takes a transaction-scoped
// advisory lock first (exampledb.CreateObjects), as pgstore.Open does for its schema.
func TestReplicasStartAtOnce(t *testing.T) {
	const replicas, rounds = 8, 10
	for round := range rounds {
		dsn, schema := pgtest.Schema(t)
		for _, err := range exampledb.StartAtOnce(dsn, schema, replicas, func(ctx context.Context, s *exampledb.Store) error {
			_, err := newPGItems(ctx, s.Pool, s.Schema)
			return err
		}) {
			t.Errorf("round %d: %v", round, err)
		}
	}
}
