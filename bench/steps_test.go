package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
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

// TestMain stops the PostgreSQL cluster BenchmarkSteps started, if it started one.
func TestMain(m *testing.M) {
	code := m.Run()
	if stepsPG.cluster != nil {
		_ = stepsPG.cluster.Stop()
	}
	os.Exit(code)
}

// stepsConcs are the callers BenchmarkSteps runs at.
var stepsConcs = []int{1, 8}

var stepsNames = [3]string{"reserve", "charge", "notify"}

// BenchmarkSteps is the cost of steps (issue 45, "Cost"): one DB.Do whose fn runs three
// Lease.Steps (steps3: a claim, each step's start and outcome, the receipt) next to three
// DB.Do calls in a row on three keys (do3: three claims, three receipts), on new keys, on
// Pebble (durable, on disk) and on PostgreSQL, at 1 and 8 callers. One op is one action:
// the three steps, or the three Dos. Each step's result, and each Do's, is 128 bytes.
//
// syncs/op is the durable writes per action as the engine's storage counts them: on Pebble
// the WAL syncs (at conc=1 each durable write is one sync; below that at 8 callers is group
// commit), on PostgreSQL the WAL flushes (pg_stat_wal.wal_sync, read after the pool's
// backends exit, so some server background flushes are in it).
//
// PostgreSQL is RECEIPTS_PG_DSN's server, or else a throwaway cluster from the installed
// binaries (skipped without them).
//
//	cd bench && go test -run '^$' -bench Steps -benchtime=2000x -count 3 .
func BenchmarkSteps(b *testing.B) {
	b.Run("pebble", func(b *testing.B) {
		for _, shape := range []string{"steps3", "do3"} {
			b.Run(shape, func(b *testing.B) {
				for _, conc := range stepsConcs {
					b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
						s, syncs := openEngine(b, engine.ModeDo, nil)
						before := syncs.WAL()
						stepsRun(b, s.DB, shape, conc)
						b.ReportMetric(float64(syncs.WAL()-before)/float64(b.N), "syncs/op")
					})
				}
			})
		}
	})
	b.Run("postgres", func(b *testing.B) {
		dsn := stepsPGDSN(b)
		ctx := context.Background()
		for _, shape := range []string{"steps3", "do3"} {
			b.Run(shape, func(b *testing.B) {
				for _, conc := range stepsConcs {
					b.Run(fmt.Sprintf("conc=%d", conc), func(b *testing.B) {
						pool, err := stores.OpenPGPool(ctx, dsn, conc+2)
						if err != nil {
							b.Fatal(err)
						}
						stepsSchemas++
						schema := fmt.Sprintf("bench_steps_%d_%d", os.Getpid(), stepsSchemas)
						db, err := pgstore.Open(ctx, pool, engine.PGOptions(schema, nil))
						if err != nil {
							pool.Close()
							b.Fatal(err)
						}
						before, walOK := walSyncs(ctx, dsn)
						stepsRun(b, db, shape, conc)
						if err := db.Close(); err != nil {
							b.Error(err)
						}
						pool.Close() // its backends exit and report their WAL statistics
						time.Sleep(300 * time.Millisecond)
						if after, ok := walSyncs(ctx, dsn); ok && walOK {
							b.ReportMetric(float64(after-before)/float64(b.N), "syncs/op")
						}
						dropSchema(ctx, dsn, schema)
					})
				}
			})
		}
	})
}

// stepsRun runs b.N actions of shape on new keys from conc callers.
func stepsRun(b *testing.B, db *receipts.DB, shape string, conc int) {
	b.Helper()
	run := workload.RunID()
	parallel(b, conc, func(ctx context.Context, w, i int) error {
		k := workload.NewKey(run, w, uint64(i))
		rk := receipts.Key{Scope: k.Scope, ID: k.ID}
		fp := workload.Fingerprint(k)
		res := workload.ResultFor(k)
		switch shape {
		case "steps3":
			_, err := db.Do(ctx, rk, fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
				out := make([]byte, 0, 3*len(res))
				for _, name := range stepsNames {
					sr, err := l.Step(ctx, name, nil, func(context.Context, *receipts.Step) ([]byte, error) { return res, nil })
					if err != nil {
						return nil, err
					}
					out = append(out, sr...)
				}
				return out, nil
			})
			return err
		default:
			for j := range 3 {
				kj := receipts.Key{Scope: rk.Scope, ID: fmt.Sprintf("%s/%d", rk.ID, j)}
				if _, err := db.Do(ctx, kj, fp, func(context.Context, *receipts.Lease) ([]byte, error) { return res, nil }); err != nil {
					return err
				}
			}
			return nil
		}
	})
}

// stepsSchemas numbers BenchmarkSteps's PostgreSQL schemas.
var stepsSchemas int

var stepsPG struct {
	once    sync.Once
	dsn     string
	cluster *pgtemp.Cluster
	err     error
}

// stepsPGDSN is RECEIPTS_PG_DSN, or a throwaway cluster's DSN (b is skipped without one).
func stepsPGDSN(b *testing.B) string {
	b.Helper()
	stepsPG.once.Do(func() {
		if d := os.Getenv("RECEIPTS_PG_DSN"); d != "" {
			stepsPG.dsn = d
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		stepsPG.cluster, stepsPG.err = pgtemp.Start(ctx)
		if stepsPG.err == nil {
			stepsPG.dsn = stepsPG.cluster.DSN
		}
	})
	if errors.Is(stepsPG.err, pgtemp.ErrNoServer) {
		b.Skip(stepsPG.err)
	}
	if stepsPG.err != nil {
		b.Fatal(stepsPG.err)
	}
	return stepsPG.dsn
}

// walSyncs is the server's count of WAL flushes (pg_stat_wal.wal_sync), false if it has
// none (before PostgreSQL 14, or since 18 where it moved to pg_stat_io).
func walSyncs(ctx context.Context, dsn string) (int64, bool) {
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return 0, false
	}
	defer c.Close(ctx)
	var n int64
	if err := c.QueryRow(ctx, "SELECT wal_sync FROM pg_stat_wal").Scan(&n); err != nil {
		return 0, false
	}
	return n, true
}

// dropSchema drops a benchmark's schema.
func dropSchema(ctx context.Context, dsn, schema string) {
	if pool, err := pgxpool.New(ctx, dsn); err == nil {
		_, _ = pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
		pool.Close()
	}
}
