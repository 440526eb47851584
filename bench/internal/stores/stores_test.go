package stores

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts/bench/internal/pgtemp"
	"github.com/receiptstore/receipts/bench/internal/workload"
)

// TestStores checks that every baseline does what its rows claim: a first call commits, a
// second call with the same key replays, another fingerprint is rejected, and Replay
// reads committed keys only.
func TestStores(t *testing.T) {
	open := map[string]func(t *testing.T) Store{
		"pebble-floor": func(t *testing.T) Store {
			s, err := OpenFloor(t.TempDir(), nil)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"bbolt": func(t *testing.T) Store {
			s, err := OpenBolt(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"sqlite": func(t *testing.T) Store {
			s, err := OpenSQLite(t.TempDir(), 4)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"postgres": func(t *testing.T) Store {
			s, err := OpenPostgres(context.Background(), pgDSN(t), 4)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"pg-floor": func(t *testing.T) Store {
			s, err := OpenPGFloor(context.Background(), pgPool(t))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"pg-tx-floor": func(t *testing.T) Store {
			s, err := OpenPGTxFloor(context.Background(), pgPool(t))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
		"fgi-style": func(t *testing.T) Store {
			s, err := OpenFGIStyle(context.Background(), pgPool(t))
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for _, name := range []string{"pebble-floor", "bbolt", "sqlite", "postgres", "pg-floor", "pg-tx-floor", "fgi-style"} {
		t.Run(name, func(t *testing.T) {
			s := open[name](t)
			defer func() {
				if err := s.Close(); err != nil {
					t.Error(err)
				}
			}()
			if s.Name() != name {
				t.Errorf("Name() = %q, want %q", s.Name(), name)
			}
			ctx := context.Background()
			k := workload.NewKey("t", 1, 1)
			fp := workload.Fingerprint(k)
			if err := s.Replay(ctx, k, fp); !errors.Is(err, ErrNotCommitted) {
				t.Errorf("Replay of a new key: %v, want ErrNotCommitted", err)
			}
			if replayed, err := s.Do(ctx, k, fp, workload.ResultFor(k)); err != nil || replayed {
				t.Fatalf("first Do: replayed=%v err=%v, want a first call", replayed, err)
			}
			if replayed, err := s.Do(ctx, k, fp, workload.ResultFor(k)); err != nil || !replayed {
				t.Errorf("second Do: replayed=%v err=%v, want a replay", replayed, err)
			}
			if err := s.Replay(ctx, k, fp); err != nil {
				t.Errorf("Replay of a committed key: %v", err)
			}
			other := workload.Fingerprint(workload.NewKey("other", 0, 0))
			if _, err := s.Do(ctx, k, other, nil); !errors.Is(err, ErrMismatch) {
				t.Errorf("Do with another fingerprint: %v, want ErrMismatch", err)
			}
			if err := s.Replay(ctx, k, other); !errors.Is(err, ErrMismatch) {
				t.Errorf("Replay with another fingerprint: %v, want ErrMismatch", err)
			}
		})
	}
}

// TestPGTxFloorEffect checks that pg-tx-floor's first call writes its effect row in the
// claim's transaction, once: a replay and a mismatched call write none, and no connection is
// left in a transaction.
func TestPGTxFloorEffect(t *testing.T) {
	pool := pgPool(t)
	ctx := context.Background()
	s, err := OpenPGTxFloor(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	k := workload.NewKey("fx", 1, 1)
	fp := workload.Fingerprint(k)
	for range 3 {
		if _, err := s.Do(ctx, k, fp, workload.ResultFor(k)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Do(ctx, k, workload.Fingerprint(workload.NewKey("other", 0, 0)), nil); !errors.Is(err, ErrMismatch) {
		t.Fatalf("Do with another fingerprint: %v, want ErrMismatch", err)
	}
	var n int
	var payload []byte
	if err := pool.QueryRow(ctx, `SELECT count(*), (array_agg(payload))[1] FROM pg_tx_floor_effects WHERE scope = $1 AND id = $2`, k.Scope, k.ID).Scan(&n, &payload); err != nil {
		t.Fatal(err)
	}
	if n != 1 || string(payload) != string(workload.ResultFor(k)) {
		t.Errorf("effect rows: %d (payload %q), want one holding the result", n, payload)
	}
	var state int16
	if err := pool.QueryRow(ctx, `SELECT state FROM pg_tx_floor WHERE scope = $1 AND id = $2`, k.Scope, k.ID).Scan(&state); err != nil || state != stateSucceeded {
		t.Errorf("claim row: state %d, err %v; want finished", state, err)
	}
	var open int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'`).Scan(&open); err != nil || open != 0 {
		t.Errorf("%d connections idle in a transaction (err %v), want 0", open, err)
	}
}

var (
	pgOnce    sync.Once
	pgCluster *pgtemp.Cluster
	pgErr     error
)

// TestMain stops the PostgreSQL cluster the tests started, if any.
func TestMain(m *testing.M) {
	code := m.Run()
	if pgCluster != nil {
		if err := pgCluster.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// pgDSN returns the DSN of a throwaway cluster shared by the tests (started on first use),
// or skips t in -short mode or without the server binaries.
func pgDSN(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts a PostgreSQL cluster")
	}
	pgOnce.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		pgCluster, pgErr = pgtemp.Start(ctx)
	})
	if errors.Is(pgErr, pgtemp.ErrNoServer) {
		t.Skip(pgErr)
	}
	if pgErr != nil {
		t.Fatal(pgErr)
	}
	return pgCluster.DSN
}

// pgPool returns a pool on the shared cluster, closed when t ends.
func pgPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := OpenPGPool(context.Background(), pgDSN(t), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
