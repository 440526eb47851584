package stores

import (
	"context"
	"errors"
	"testing"
	"time"

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
			if testing.Short() {
				t.Skip("starts a PostgreSQL cluster")
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			c, err := pgtemp.Start(ctx)
			if errors.Is(err, pgtemp.ErrNoServer) {
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				if err := c.Stop(); err != nil {
					t.Error(err)
				}
			})
			s, err := OpenPostgres(ctx, c.DSN, 4)
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	}
	for _, name := range []string{"pebble-floor", "bbolt", "sqlite", "postgres"} {
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
