package pgtest

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// A primary with a streaming standby, for tests of replication and failover. Unlike the
// cluster the package's tests share, each Pair belongs to one test: its tests stop the
// standby, kill the primary and promote the standby.

// Pair is a primary and one streaming standby of it, started for one test (StartPair).
type Pair struct {
	Primary, Standby *Cluster
	// StandbyName is the standby's application_name, which synchronous_standby_names
	// names (SetSynchronous).
	StandbyName string
}

// StartPair starts a primary (fsync on: a promotion must find what the primary flushed, and
// tests compare the two) and a streaming standby of it, both stopped and removed when t ends.
// With sync, the primary's synchronous_standby_names names the standby, and StartPair returns
// once it streams as the synchronous standby; otherwise replication is asynchronous (the
// default). Without server binaries it skips t (fails it with CI=true), as the shared cluster
// does. The package's TestMain must call Main.
func StartPair(t testing.TB, sync bool) *Pair {
	t.Helper()
	if !mainRan {
		t.Fatal("pgtest: the package's TestMain must call pgtest.Main(m)")
	}
	if _, err := FindBinDir(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL tests must run in CI: %v", err)
		}
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	primary, err := StartWith(ctx, Config{Durable: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Stop() })
	const name = "standby1"
	standby, err := primary.StartStandby(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = standby.Stop() })
	p := &Pair{Primary: primary, Standby: standby, StandbyName: name}
	if sync {
		if err := primary.SetSynchronous(ctx, name); err != nil {
			t.Fatal(err)
		}
		if err := primary.WaitStandby(ctx, name, "sync"); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// MultiHostDSN is the DSN of the primary and the standby in that order, with
// target_session_attrs=read-write, for database db: pgx connects to whichever of the two is
// the primary (the first, until the standby is promoted).
func (p *Pair) MultiHostDSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?sslmode=disable&target_session_attrs=read-write",
		p.Primary.Port, p.Standby.Port, db)
}
