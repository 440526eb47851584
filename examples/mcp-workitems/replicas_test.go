package main

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/examples/internal/exampledb"
	"github.com/receiptstore/receipts/internal/pgtest"
)

// Several replicas of the server started at the same moment on an empty database (here an
// empty schema), each with its own pool, as `mcp-workitems -pg DSN` started N times: every
// one opens the store and creates the tracker's sequence and table, and every one starts.
// Concurrent CREATE … IF NOT EXISTS is not safe in PostgreSQL (each can pass the existence
// check, then one fails on the catalog's unique index): on the code before, replicas died with
// `tracker: ERROR: duplicate key value violates unique constraint "pg_type_typname_nsp_index"`
// (issue 43, item 4). The creation now takes a transaction-scoped advisory lock first
// (exampledb.CreateObjects), as pgstore.Open does for its schema.
func TestReplicasStartAtOnce(t *testing.T) {
	const replicas, rounds = 8, 10
	for round := range rounds {
		dsn, schema := pgtest.Schema(t)
		var opened, wg sync.WaitGroup
		opened.Add(replicas)
		errs := make(chan error, replicas)
		for i := range replicas {
			wg.Add(1)
			go func() {
				defer wg.Done()
				store, err := exampledb.Open(context.Background(), exampledb.Config{PG: dsn, Schema: schema, Options: receipts.Options{GCInterval: -1}})
				opened.Done()
				if err != nil {
					errs <- fmt.Errorf("replica %d: open: %w", i, err)
					return
				}
				defer store.Close()
				opened.Wait() // every replica's store is open: they create their table at once
				if _, err := openPGTracker(context.Background(), store.Pool, store.Schema); err != nil {
					errs <- fmt.Errorf("replica %d: %w", i, err)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
	}
}
