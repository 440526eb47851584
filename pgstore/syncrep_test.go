package pgstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
)

// Tests of what survives a failover with synchronous replication (syncrep.go): each starts
// its own primary and synchronous standby (pgtest.StartPair), stops the standby so that
// COMMITs wait for it, and ends with a failover where it matters (the primary SIGKILLed, the
// standby promoted).

// syncDB opens a store on dsn's database, on a pool built with Configure and then tune.
func syncDB(t *testing.T, dsn string, o Options, tune func(*pgxpool.Config)) *receipts.DB {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		t.Fatal(err)
	}
	Configure(cfg)
	if tune != nil {
		tune(cfg)
	}
	pool, err := pgxpool.NewWithConfig(bg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	db, err := Open(bg, pool, &o)
	if err != nil {
		pool.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = db.Close()
		pool.Close()
	})
	return db
}

// cancelSyncWaits cancels (pg_cancel_backend) every backend waiting for the synchronous
// standby, again and again, until done delivers, and returns what it delivered. (Renewals of a
// lease in Do wait for the standby too: a first cancel may hit one of them.)
func cancelSyncWaits(t *testing.T, dsn string, done <-chan error) error {
	t.Helper()
	conn, err := pgx.Connect(bg, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(bg)
	for range 1000 {
		select {
		case err := <-done:
			return err
		default:
		}
		if _, err := conn.Exec(bg, `SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("the call whose wait for the standby was cancelled did not return")
	return nil
}

// syncWaits is how many backends of application app wait for the synchronous standby now.
func syncWaits(t *testing.T, dsn, app string) int {
	t.Helper()
	conn, err := pgx.Connect(bg, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(bg)
	var n int
	if err := conn.QueryRow(bg, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep' AND application_name = $1`, app).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// failover SIGKILLs p's primary and promotes its standby; with start, it starts the standby
// first (after the kill: it has only what it received before it was stopped).
func failover(t *testing.T, p *pgtest.Pair, start bool) {
	t.Helper()
	if err := p.Primary.Kill(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(bg, time.Minute)
	defer cancel()
	if start {
		if err := p.Standby.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Standby.Promote(ctx); err != nil {
		t.Fatal(err)
	}
}

// metric is the engine metric name of db.
func metric(t *testing.T, db *receipts.DB, name string) float64 {
	t.Helper()
	for _, m := range db.EngineMetrics() {
		if m.Name == name {
			return m.Value
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

// A finish whose COMMIT waits for a stopped synchronous standby and is cancelled there
// (pg_cancel_backend) is committed on the primary only: PostgreSQL warns and answers COMMIT.
// It is not reported committed: Lease.Commit returns an error wrapping ErrNotReplicated, Do
// returns ErrOutcomeUnknown. A finish whose caller's context ends, on a pool whose pgx sends
// a cancel request then (CancelRequestContextWatcherHandler), returns the context's error and
// is not cancelled: it goes on waiting for the standby. After the failover (the primary
// SIGKILLed, the standby promoted) none of those receipts exists, none was reported, and the
// next attempt of the key Do abandoned is Recovered.
//
// On the code before checkedCommit and unCancelled, the cancelled Commit and Do returned
// their receipts as committed, and so did the Commit whose context ended (pgx's cancel
// request cancelled its wait, and the server answered COMMIT): three acknowledged receipts
// that the failover lost.
//
// statement_timeout does not cancel the wait on PostgreSQL 15 (it is disarmed before the
// commit: a COMMIT with statement_timeout 300 ms on the session waited past 3 s), so it
// needs no case here; a server that did cancel there would be caught as pg_cancel_backend is.
func TestCancelledFinishWait(t *testing.T) {
	t.Parallel() // a cluster pair of its own
	p := pgtest.StartPair(t, true)
	const ttl = time.Second
	o := Options{Options: receipts.Options{LeaseTTL: ttl}}
	db := syncDB(t, p.Primary.DSN, o, nil)
	cr := syncDB(t, p.Primary.DSN, o, func(c *pgxpool.Config) {
		c.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
		}
		c.ConnConfig.RuntimeParams["application_name"] = "cr"
	})
	k1, k2, k3 := receipts.Key{Scope: "s", ID: "cancelled"}, receipts.Key{Scope: "s", ID: "deadline"}, receipts.Key{Scope: "s", ID: "do"}
	l1, _, err := db.Claim(bg, k1, []byte("fp"))
	if err != nil {
		t.Fatal(err)
	}
	l2, _, err := cr.Claim(bg, k2, []byte("fp"))
	if err != nil {
		t.Fatal(err)
	}
	inFn, release := make(chan struct{}), make(chan struct{})
	doErr := make(chan error, 1)
	go func() {
		_, err := db.Do(bg, k3, []byte("fp"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
			close(inFn)
			<-release
			return []byte("done"), nil
		})
		doErr <- err
	}()
	<-inFn
	if err := p.Standby.Shutdown(bg); err != nil {
		t.Fatal(err)
	}
	if metric(t, db, "postgres_commits_unconfirmed_total") != 0 {
		t.Fatal("unconfirmed commits before any was cancelled")
	}

	// pg_cancel_backend of a waiting Commit.
	commitErr := make(chan error, 1)
	go func() { _, err := l1.Commit(bg, []byte("r1")); commitErr <- err }()
	if err := cancelSyncWaits(t, p.Primary.DSN, commitErr); !errors.Is(err, ErrNotReplicated) {
		t.Errorf("cancelled commit: %v, want ErrNotReplicated", err)
	}
	// The caller's context ends; pgx would send a cancel request.
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	r, err := l2.Commit(ctx, []byte("r2"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("commit whose context ended while it waited: %+v, %v: want the context's error", r, err)
	}
	if n := syncWaits(t, p.Primary.DSN, "cr"); n != 1 {
		t.Errorf("%d commits of the pool wait for the standby, want 1: the one whose caller left was cancelled", n)
	}
	if got := metric(t, cr, "postgres_commits_unconfirmed_total"); got != 0 {
		t.Errorf("postgres_commits_unconfirmed_total %v: the commit whose caller left was cancelled", got)
	}
	// Do's commit.
	close(release)
	if err := cancelSyncWaits(t, p.Primary.DSN, doErr); !errors.Is(err, receipts.ErrOutcomeUnknown) || !errors.Is(err, ErrNotReplicated) {
		t.Errorf("Do whose commit was cancelled: %v, want ErrOutcomeUnknown and ErrNotReplicated", err)
	}
	if got := metric(t, db, "postgres_commits_unconfirmed_total"); got < 2 { // and renewals of Do's lease
		t.Errorf("postgres_commits_unconfirmed_total: %v, want at least 2", got)
	}

	failover(t, p, true)
	after := syncDB(t, p.Standby.DSN, o, nil)
	for _, k := range []receipts.Key{k1, k2} {
		if r, err := after.Lookup(bg, k); err != nil || r.State != receipts.Pending {
			t.Errorf("%v after the failover: %+v, %v: want its claim, Pending (no receipt was reported)", k, r, err)
		}
	}
	ctx, cancel = context.WithTimeout(bg, 30*time.Second)
	defer cancel()
	l, r3, err := after.Claim(ctx, k3, []byte("fp"), receipts.WaitForResult())
	if err != nil || l == nil || !l.Recovered() {
		t.Fatalf("the next attempt of %v after the failover: lease %v, receipt %+v, %v: want a Recovered lease", k3, l, r3, err)
	}
}

// A claim whose COMMIT waits for a stopped synchronous standby, on a pool whose pgx sends a
// cancel request when a context ends (CancelRequestContextWatcherHandler), is not cancelled
// when the caller's context ends: the caller gets its context's error, the COMMIT goes on
// waiting, and once the standby is back the claim, which nobody holds, is undone. Nothing
// was handed out, and after the failover the key is free: a retry is a first attempt, and
// runs once.
//
// On the code before claims were sent detached, pgx's cancel request cancelled the COMMIT's
// wait: PostgreSQL committed the claim on the primary only and answered COMMIT, and Claim
// handed out the lease. After the failover the key was free, and the retry ran fn again.
func TestCancelledClaimWait(t *testing.T) {
	t.Parallel() // a cluster pair of its own
	p := pgtest.StartPair(t, true)
	db := syncDB(t, p.Primary.DSN, Options{}, func(c *pgxpool.Config) {
		c.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
		}
		c.ConnConfig.RuntimeParams["application_name"] = "cr"
	})
	var before uint64 // the largest token handed out before the failover
	for i := range 20 {
		l, _, err := db.Claim(bg, receipts.Key{Scope: "s", ID: fmt.Sprint("warm", i)}, []byte("fp"))
		if err != nil {
			t.Fatal(err)
		}
		before = max(before, l.Token())
	}
	k := receipts.Key{Scope: "s", ID: "claim"}
	abandoned, _, err := db.Claim(bg, receipts.Key{Scope: k.Scope, ID: k.ID + "-takeover"}, []byte("fp"))
	if err != nil {
		t.Fatal(err)
	}
	if err := abandoned.Abandon(bg); err != nil {
		t.Fatal(err)
	}
	if err := p.Standby.Shutdown(bg); err != nil {
		t.Fatal(err)
	}
	// A first claim ([BEGIN; lock; insert; COMMIT]), and a takeover of an abandoned claim (its
	// transaction's COMMIT).
	for _, mode := range []string{"alone", "takeover"} {
		kk := receipts.Key{Scope: k.Scope, ID: k.ID + "-" + mode}
		ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
		l, _, err := db.Claim(ctx, kk, []byte("fp"))
		cancel()
		if err == nil || l != nil {
			t.Fatalf("%s: a claim whose COMMIT never came back handed out lease %v (%v)", mode, l, err)
		}
		if n := syncWaits(t, p.Primary.DSN, "cr"); n == 0 {
			t.Errorf("%s: the claim's COMMIT no longer waits for the standby: it was cancelled", mode)
		}
	}
	if got := metric(t, db, "postgres_commits_unconfirmed_total"); got != 0 {
		t.Errorf("postgres_commits_unconfirmed_total %v: a COMMIT was cancelled", got)
	}
	if err := p.Standby.Start(bg); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil { // waits for the claims to be undone
		t.Fatal(err)
	}
	failover(t, p, false)
	after := syncDB(t, p.Standby.DSN, Options{}, nil)
	for _, mode := range []string{"alone", "takeover"} {
		kk := receipts.Key{Scope: k.Scope, ID: k.ID + "-" + mode}
		r, err := after.Lookup(bg, kk)
		switch {
		case mode == "alone" && !errors.Is(err, receipts.ErrNotFound):
			t.Errorf("%v after the failover: %+v, %v: want free (the claim was undone)", kk, r, err)
		case mode == "takeover" && (err != nil || r.State != receipts.Pending || r.LeaseExpiresAt.After(time.Now().Add(time.Second))):
			t.Errorf("%v after the failover: %+v, %v: want the abandoned claim (the takeover was undone)", kk, r, err)
		}
		l, _, err := after.Claim(bg, kk, []byte("fp"))
		if err != nil || l.Recovered() != (mode == "takeover") || (mode == "alone" && l.Attempt() != 1) {
			t.Errorf("%v: the retry: %+v, %v: want a first attempt, or a Recovered one after the abandoned claim", kk, l, err)
			continue
		}
		// Tokens across the promotion: token_seq's WAL reached the standby with the claims
		// that used it, so every token after the failover is larger than every one before.
		if l.Token() <= before {
			t.Errorf("token %d after the failover, not above %d handed out before", l.Token(), before)
		}
	}
}

// RequireSyncStandby refuses to open on a pool without the notice handler, or without a
// synchronous standby streaming, and refuses claims while the standby is away; the metrics
// say what the engine sees.
func TestRequireSyncStandby(t *testing.T) {
	t.Parallel() // a cluster pair of its own
	p := pgtest.StartPair(t, true)
	o := Options{RequireSyncStandby: true}
	// A pool without Configure.
	pool, err := pgxpool.New(bg, p.Primary.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if _, err := Open(bg, pool, &o); !errors.Is(err, ErrNoSyncStandby) || !errors.Is(err, ErrPoolNotConfigured) {
		t.Fatalf("Open on a pool without Configure: %v, want ErrNoSyncStandby and ErrPoolNotConfigured", err)
	}

	db := syncDB(t, p.Primary.DSN, o, nil)
	if metric(t, db, "postgres_commit_check") != 1 || metric(t, db, "postgres_sync_standby_up") != 1 {
		t.Errorf("metrics: %+v", db.EngineMetrics())
	}
	if _, _, err := db.Claim(bg, receipts.Key{Scope: "s", ID: "up"}, []byte("fp")); err != nil {
		t.Fatal(err)
	}
	if err := p.Standby.Shutdown(bg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the standby seen gone", func() bool { return metric(t, db, "postgres_sync_standby_up") == 0 })
	if _, _, err := db.Claim(bg, receipts.Key{Scope: "s", ID: "down"}, []byte("fp")); !errors.Is(err, ErrNoSyncStandby) {
		t.Errorf("claim without the standby: %v, want ErrNoSyncStandby", err)
	}
	cfg, _ := pgxpool.ParseConfig(p.Primary.DSN)
	Configure(cfg)
	pool2, err := pgxpool.NewWithConfig(bg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool2.Close()
	if _, err := Open(bg, pool2, &o); !errors.Is(err, ErrNoSyncStandby) {
		t.Errorf("Open without the standby: %v, want ErrNoSyncStandby", err)
	}
	if err := p.Standby.Start(bg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the standby seen back", func() bool { return metric(t, db, "postgres_sync_standby_up") == 1 })
	if _, _, err := db.Claim(bg, receipts.Key{Scope: "s", ID: "back"}, []byte("fp")); err != nil {
		t.Errorf("claim with the standby back: %v", err)
	}
	// Asynchronous replication: refused.
	if err := p.Primary.SetSynchronous(bg, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "asynchronous replication seen", func() bool { return metric(t, db, "postgres_sync_standby_configured") == 0 })
	if _, _, err := db.Claim(bg, receipts.Key{Scope: "s", ID: "async"}, []byte("fp")); !errors.Is(err, ErrNoSyncStandby) {
		t.Errorf("claim with asynchronous replication: %v, want ErrNoSyncStandby", err)
	}
}

// A pool built the ordinary pgx way (pgxpool.New, without Configure) cannot tell a COMMIT
// whose wait for the synchronous standby was cancelled (committed on the primary only, lost by
// a failover) from a durable one. On a database with synchronous_standby_names set, Open
// refuses it with an error wrapping ErrPoolNotConfigured that names pgstore.Configure, and a
// pool built with Configure opens and claims. A store opened on such a pool while replication
// was asynchronous opens (nothing waits for a standby; the metric postgres_commit_check says
// 0), and refuses claims once synchronous_standby_names is set.
//
// On the code before, Open took the plain pool with a log line only: Do then reported success
// for receipts a failover lost, and Claim handed out leases a failover lost (issue 43, item 3).
func TestPlainPoolRefused(t *testing.T) {
	t.Parallel() // a cluster pair of its own
	p := pgtest.StartPair(t, true)
	plainPool := func() *pgxpool.Pool {
		pool, err := pgxpool.New(bg, p.Primary.DSN) // as ordinary pgx code builds it
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		return pool
	}
	db, err := Open(bg, plainPool(), nil)
	if err == nil {
		_ = db.Close()
		t.Fatal("Open on a plain pool with a synchronous standby: opened, want ErrPoolNotConfigured")
	}
	if !errors.Is(err, ErrPoolNotConfigured) || !strings.Contains(err.Error(), "pgstore.Configure") {
		t.Fatalf("Open on a plain pool with a synchronous standby: %v, want ErrPoolNotConfigured naming pgstore.Configure", err)
	}
	t.Logf("refused: %v", err)
	configured := syncDB(t, p.Primary.DSN, Options{}, nil)
	if _, _, err := configured.Claim(bg, receipts.Key{Scope: "s", ID: "configured"}, []byte("fp")); err != nil {
		t.Fatalf("claim on a pool built with Configure: %v", err)
	}

	// Opened while replication was asynchronous: claims are refused once it is synchronous.
	if err := p.Primary.SetSynchronous(bg, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "asynchronous replication seen", func() bool { return metric(t, configured, "postgres_sync_standby_configured") == 0 })
	plain, err := Open(bg, plainPool(), nil)
	if err != nil {
		t.Fatalf("Open on a plain pool without synchronous_standby_names: %v", err)
	}
	defer plain.Close()
	if metric(t, plain, "postgres_commit_check") != 0 {
		t.Errorf("postgres_commit_check on a plain pool: %v, want 0", metric(t, plain, "postgres_commit_check"))
	}
	if _, _, err := plain.Claim(bg, receipts.Key{Scope: "s", ID: "async"}, []byte("fp")); err != nil {
		t.Fatalf("claim on a plain pool without synchronous_standby_names: %v", err)
	}
	if err := p.Primary.SetSynchronous(bg, p.StandbyName); err != nil {
		t.Fatal(err)
	}
	if err := p.Primary.WaitStandby(bg, p.StandbyName, "sync"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "synchronous replication seen", func() bool { return metric(t, plain, "postgres_sync_standby_configured") == 1 })
	if _, err := plain.Do(bg, receipts.Key{Scope: "s", ID: "sync"}, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
		t.Error("fn ran on a plain pool with a synchronous standby")
		return nil, nil
	}); !errors.Is(err, ErrPoolNotConfigured) {
		t.Errorf("Do on a plain pool once synchronous_standby_names is set: %v, want ErrPoolNotConfigured", err)
	}
	if _, _, err := configured.Claim(bg, receipts.Key{Scope: "s", ID: "configured-sync"}, []byte("fp")); err != nil {
		t.Errorf("claim on a pool built with Configure: %v", err)
	}
}

// waitFor polls cond (every 50 ms, up to 10 s: the engine reads the replication state every
// second).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 200 {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// Error messages say each layer's word once: "pgstore: claim: commit not confirmed by a
// synchronous standby: …", not "pgstore: claim: pgstore: claim: pgstore: commit not confirmed
// …" (issue 43, item 6). The errors come from the real thing: a primary whose synchronous
// standby is stopped, and COMMITs whose wait for it is cancelled (a claim, a lease's commit,
// Do's commit, DoTx's commit), and Open refusing a pool without Configure.
func TestErrorPrefixesOnce(t *testing.T) {
	t.Parallel() // a cluster pair of its own
	p := pgtest.StartPair(t, true)
	once := func(what string, err error, sentinel error, words ...string) {
		t.Helper()
		if !errors.Is(err, sentinel) {
			t.Errorf("%s: %v, want %v", what, err, sentinel)
			return
		}
		msg := err.Error()
		for _, w := range append([]string{"pgstore: ", sentinelText(sentinel)}, words...) {
			n := strings.Count(msg, w)
			if w == "pgstore: " { // the root may add a second error of the engine's: "… (pgstore: abandon: …)"
				n -= strings.Count(msg, "(pgstore: ")
			}
			if n != 1 {
				t.Errorf("%s: %q %d times in %q, want once", what, w, n, msg)
			}
		}
		t.Logf("%s: %v", what, err)
	}

	plain, err := pgxpool.New(bg, p.Primary.DSN)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	_, err = Open(bg, plain, &Options{RequireSyncStandby: true})
	once("Open on a plain pool", err, ErrPoolNotConfigured)
	once("Open on a plain pool", err, ErrNoSyncStandby)

	db := syncDB(t, p.Primary.DSN, Options{}, nil)
	l, _, err := db.Claim(bg, receipts.Key{Scope: "s", ID: "commit"}, []byte("fp"))
	if err != nil {
		t.Fatal(err)
	}
	inFn, release := make(chan struct{}, 2), make(chan struct{})
	doErr, dotxErr := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := db.Do(bg, receipts.Key{Scope: "s", ID: "do"}, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			inFn <- struct{}{}
			<-release
			return []byte("done"), nil
		})
		doErr <- err
	}()
	go func() {
		_, err := DoTx(bg, db, receipts.Key{Scope: "s", ID: "dotx"}, []byte("fp"), func(context.Context, pgx.Tx, *receipts.Lease) ([]byte, error) {
			inFn <- struct{}{}
			<-release
			return []byte("done"), nil
		})
		dotxErr <- err
	}()
	<-inFn
	<-inFn
	if err := p.Standby.Shutdown(bg); err != nil {
		t.Fatal(err)
	}

	claimErr := make(chan error, 1)
	go func() {
		_, _, err := db.Claim(bg, receipts.Key{Scope: "s", ID: "claim"}, []byte("fp"))
		claimErr <- err
	}()
	once("Claim", cancelSyncWaits(t, p.Primary.DSN, claimErr), ErrNotReplicated, "claim: ")
	commitErr := make(chan error, 1)
	go func() { _, err := l.Commit(bg, []byte("r")); commitErr <- err }()
	once("Lease.Commit", cancelSyncWaits(t, p.Primary.DSN, commitErr), ErrNotReplicated)
	close(release)
	once("Do", cancelSyncWaits(t, p.Primary.DSN, doErr), ErrNotReplicated, "receipts: outcome unknown")
	once("DoTx", cancelSyncWaits(t, p.Primary.DSN, dotxErr), ErrNotReplicated, "dotx: ")
}

// sentinelText is a sentinel's message without its package's prefix.
func sentinelText(err error) string {
	s := err.Error()
	if i := strings.Index(s, ": "); i >= 0 {
		return s[i+2:]
	}
	return s
}
