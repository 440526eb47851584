package pgstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/receiptstest"
)

// Claims of many keys at once, some batched (claim.go), answer as claims sent one by one:
// new keys are claimed once each, finished keys of another node are replayed (or mismatched),
// keys past retention are tombstoned (tombstones on) or claimed afresh, and two claims of one
// key give one claim and one InProgress. Every key ends with one row, and no token is handed
// out twice. The same workload runs with batching off, and the outcomes must be the same.
func TestClaimBatch(t *testing.T) {
	for _, tombs := range []bool{true, false} {
		for _, batching := range []bool{true, false} {
			t.Run(fmt.Sprintf("tombstones=%v/batching=%v", tombs, batching), func(t *testing.T) {
				leakCheck(t)
				testClaimBatch(t, tombs, batching)
			})
		}
	}
}

// twoNodes opens two nodes on a fresh schema, on one injected clock, Retention 1h, with
// tombstones (a 2h window) or without.
func twoNodes(t *testing.T, tombs bool) (*receiptstest.Clock, *node, *node) {
	d := newTestDB(t)
	clk := newClock()
	o := engineOptions{Now: clk.Now, Retention: time.Hour, TombstoneWindow: -1}
	if tombs {
		o.TombstoneWindow = 2 * time.Hour
	}
	return clk, d.open(o), d.open(o)
}

func testClaimBatch(t *testing.T, tombs, batching bool) {
	clk, a, b := twoNodes(t, tombs)
	a.testNoBatch = !batching
	finish := func(id string) {
		k := key(id)
		c := mustClaim(t, b.engine, req(k, "fp"), driver.Claimed)
		if _, err := b.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("r-"+id)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 20 {
		finish(fmt.Sprintf("old-%d", i))
	}
	clk.Advance(61 * time.Minute)
	for i := range 20 {
		finish(fmt.Sprintf("done-%d", i))
	}

	type call struct {
		r    driver.ClaimRequest
		want driver.Outcome
	}
	var calls []call
	for i := range 120 {
		calls = append(calls, call{req(key(fmt.Sprintf("new-%d", i)), "fp"), driver.Claimed})
	}
	for i := range 20 {
		calls = append(calls, call{req(key(fmt.Sprintf("done-%d", i)), "fp"), driver.Replay})
		calls = append(calls, call{req(key(fmt.Sprintf("old-%d", i)), "fp"), map[bool]driver.Outcome{true: driver.Expired, false: driver.Claimed}[tombs]})
	}
	for i := range 10 {
		calls = append(calls, call{req(key(fmt.Sprintf("done-%d", i)), "other"), driver.Mismatch})
	}
	dups := 10
	const dupWant = driver.Outcome(255) // one Claimed, one InProgress
	for i := range dups {
		k := key(fmt.Sprintf("dup-%d", i))
		calls = append(calls, call{req(k, "fp"), dupWant}, call{req(k, "fp"), dupWant}) // one Claimed, one InProgress
	}

	type answer struct {
		res driver.ClaimResult
		err error
	}
	answers := make([]answer, len(calls))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range calls {
		wg.Go(func() {
			<-start
			res, err := a.Claim(bg, calls[i].r)
			answers[i] = answer{res, err}
		})
	}
	close(start)
	wg.Wait()

	dupOutcomes := map[driver.Key][]driver.Outcome{}
	for i, c := range calls {
		got := answers[i]
		if got.err != nil {
			t.Fatalf("claim %v: %v", c.r.Key, got.err)
		}
		if c.want == dupWant {
			dupOutcomes[c.r.Key] = append(dupOutcomes[c.r.Key], got.res.Outcome)
			continue
		}
		if got.res.Outcome != c.want {
			t.Errorf("claim %v (fp %s): %v, want %v", c.r.Key, c.r.Fingerprint, got.res.Outcome, c.want)
		}
		if c.want == driver.Replay && string(got.res.Record.Result) != "r-"+c.r.Key.ID {
			t.Errorf("replay %v: result %q", c.r.Key, got.res.Record.Result)
		}
		if c.want == driver.Claimed && (got.res.Record.Token == 0 || got.res.Record.State != driver.Pending) {
			t.Errorf("claim %v: record %+v", c.r.Key, got.res.Record)
		}
	}
	for k, outs := range dupOutcomes {
		claimed, inProgress := 0, 0
		for _, o := range outs {
			switch o {
			case driver.Claimed:
				claimed++
			case driver.InProgress:
				inProgress++
			}
		}
		if claimed != 1 || inProgress != 1 {
			t.Errorf("two claims of %v: %v, want one Claimed and one InProgress", k, outs)
		}
	}
	// one row per key, every token handed out once
	var keys, rows, tokens int
	if err := a.pool.QueryRow(bg, `SELECT count(DISTINCT (scope, id)), count(*), count(DISTINCT token) FROM `+a.q.schema+`.records`).Scan(&keys, &rows, &tokens); err != nil {
		t.Fatal(err)
	}
	if keys != rows || rows != tokens {
		t.Errorf("records: %d keys, %d rows, %d distinct tokens", keys, rows, tokens)
	}
	n := a.claims.batches.Load()
	if batching && n == 0 {
		t.Errorf("%d concurrent claims sent no batch", len(calls))
	}
	// the engine's metrics count the batches and the calls they carried
	metric := map[string]float64{}
	for _, m := range a.Metrics() {
		metric[m.Name] = m.Value
	}
	batches := a.claims.batches.Load() + a.finishes.batches.Load() + a.lookups.batches.Load()
	if got := metric["postgres_batches_total"]; got != float64(batches) || (batching && got == 0) {
		t.Errorf("postgres_batches_total %v, want %d", got, batches)
	}
	if got := metric["postgres_batched_calls_total"]; got < 2*float64(batches) || (batches == 0 && got != 0) {
		t.Errorf("postgres_batched_calls_total %v for %d batches", got, batches)
	}
	if !batching && n != 0 {
		t.Errorf("batching off, but %d batches sent", n)
	}
	if f := a.batchFailures.Load(); f != 0 || metric["postgres_batch_failures_total"] != 0 {
		t.Errorf("%d batches failed (metric %v)", f, metric["postgres_batch_failures_total"])
	}
	t.Logf("%d claims, %d batches of two or more", len(calls), n)
}

// holdLocks opens a transaction holding the advisory locks of keys (as a claim or DoTx does);
// release commits it.
func holdLocks(t *testing.T, e *engine, keys ...driver.Key) (release func()) {
	t.Helper()
	tx, err := e.pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, err := tx.Exec(bg, e.q.lock, lockClass, lockID(keyHash(k))); err != nil {
			t.Fatal(err)
		}
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Commit(bg) }) }
	t.Cleanup(release)
	return release
}

// waitInflight waits until e's claim combiner has as many batches in flight as it allows.
func waitInflight(t *testing.T, e *engine) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		e.claims.mu.Lock()
		in := e.claims.inflight
		e.claims.mu.Unlock()
		if in == batchInflight {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the first claims never went in flight")
		}
	}
}

// waitQueued waits until n claims wait in e's batch queue.
func waitQueued(t *testing.T, e *engine, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		e.claims.mu.Lock()
		q := len(e.claims.queue)
		e.claims.mu.Unlock()
		if q == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d claims queued, want %d", q, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// A key whose lock another transaction holds (a DoTx running its effect) does not hold up
// the other keys of its batch: it is left out of the batch and claims alone, waiting for its
// lock; the others are claimed while that transaction is still open, and the blocked key once
// it ends.
func TestClaimBatchLockedKeyDoesNotBlockOthers(t *testing.T) {
	leakCheck(t)
	d := newTestDB(t)
	e := d.open(engineOptions{}).engine
	p1, p2, x := key("p1"), key("p2"), key("x")
	release1 := holdLocks(t, e, p1)
	release2 := holdLocks(t, e, p2)
	releaseX := holdLocks(t, e, x)

	results := make(chan error, 8)
	claim := func(k driver.Key) {
		res, err := e.Claim(bg, req(k, "fp"))
		if err == nil && res.Outcome != driver.Claimed {
			err = fmt.Errorf("claim %v: %v", k, res.Outcome)
		}
		results <- err
	}
	go claim(p1) // the two senders in flight, each waiting on its key's lock
	go claim(p2)
	waitInflight(t, e)
	others := []driver.Key{key("f1"), key("f2"), key("f3")}
	xDone := make(chan error, 1)
	go func() {
		res, err := e.Claim(bg, req(x, "fp"))
		if err == nil && res.Outcome != driver.Claimed {
			err = fmt.Errorf("claim x: %v", res.Outcome)
		}
		xDone <- err
	}()
	waitQueued(t, e, 1)
	for _, k := range others {
		go claim(k)
	}
	waitQueued(t, e, 4)
	release1() // p1's sender answers, then sends [x, f1, f2, f3]: x's lock times out
	release2()
	for range 2 + len(others) {
		select {
		case err := <-results:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("claims held up by a key locked elsewhere")
		}
	}
	select {
	case err := <-xDone:
		t.Fatalf("the locked key was claimed while its lock was held: %v", err)
	default:
	}
	if e.claims.batches.Load() == 0 {
		t.Fatal("no batch was sent")
	}
	releaseX()
	if err := <-xDone; err != nil {
		t.Fatal(err)
	}
}

// A queued claim whose context ends returns at once and writes nothing; a batch member whose
// caller is gone by the time its batch answers has the claim it was granted undone, so no
// lease is left without a holder.
func TestClaimBatchCallerGone(t *testing.T) {
	leakCheck(t)
	d := newTestDB(t)
	e := d.open(engineOptions{}).engine
	p1, p2 := key("p1"), key("p2")
	release1 := holdLocks(t, e, p1)
	release2 := holdLocks(t, e, p2)
	done := make(chan error, 2)
	for _, k := range []driver.Key{p1, p2} {
		go func() { _, err := e.Claim(bg, req(k, "fp")); done <- err }()
	}
	waitInflight(t, e)
	ctx, cancel := context.WithCancel(bg)
	gone := make(chan error, 1)
	go func() { _, err := e.Claim(ctx, req(key("queued"), "fp")); gone <- err }()
	waitQueued(t, e, 1)
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("queued claim whose context ended: %v", err)
	}
	waitQueued(t, e, 0)
	release1()
	release2()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}

	// a batch whose second member's caller is gone when it answers
	e.claims.mu.Lock()
	e.claims.inflight++
	e.claims.mu.Unlock()
	self := &freshCall{ctx: bg, key: key("self"), v: freshV{req: req(key("self"), "fp"), nonce: newNonce()}}
	other := &freshCall{ctx: bg, key: key("other"), v: freshV{req: req(key("other"), "fp"), nonce: newNonce()}, done: make(chan struct{})}
	other.state.Store(callGone)
	e.claims.run(bg, self, []*freshCall{self, other})
	if self.v.err != nil || self.v.got != freshClaimed || other.v.got != freshClaimed {
		t.Fatalf("batch: self %v %v, other %v %v", self.v.got, self.v.err, other.v.got, other.v.err)
	}
	for _, c := range []struct {
		k    driver.Key
		want int
	}{{key("self"), 1}, {key("other"), 0}, {key("queued"), 0}} {
		var n int
		if err := e.pool.QueryRow(bg, `SELECT count(*) FROM `+e.q.schema+`.records WHERE id = $1`, []byte(c.k.ID)).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != c.want {
			t.Errorf("%v: %d records, want %d", c.k, n, c.want)
		}
	}
	if e.claims.inflight != 0 {
		t.Errorf("in flight after the batches: %d", e.claims.inflight)
	}
}

// The first claims' functions (queries.freshFn, queries.freshManyFn) run on the server with
// and without tombstones (PL/pgSQL checks a statement in a function only when it first runs
// it: a typo in the branch of one setting would only show under that setting, or under load).
func TestClaimBatchStatementsPrepare(t *testing.T) {
	d := newTestDB(t)
	for _, tombs := range []bool{true, false} {
		o := engineOptions{TombstoneWindow: -1}
		if tombs {
			o.TombstoneWindow = time.Hour
		}
		e := d.open(o).engine
		tx, err := e.pool.Begin(bg)
		if err != nil {
			t.Fatal(err)
		}
		ks := []driver.Key{key("prep-1"), key("prep-2")}
		r1 := req(ks[0], "fp")
		rows, err := tx.Query(bg, e.q.freshFn, e.freshArgs(r1, newNonce(), e.nowArg())...)
		n := 0
		if err == nil {
			for rows.Next() {
				n++
			}
			rows.Close()
			err = rows.Err()
		}
		if err != nil || n != 1 {
			t.Errorf("tombstones %v: first claim: %d rows, %v", tombs, n, err)
		}
		var locks, slocks []int32
		var sids, scopes, ids, fps, nonces [][]byte
		var leases []int64
		for _, k := range ks {
			id := driver.ScopeID(e.secret, k.Scope)
			locks, slocks, sids = append(locks, lockID(keyHash(k))), append(slocks, scopeLock(id)), append(sids, id)
			scopes, ids = append(scopes, []byte(k.Scope)), append(ids, []byte(k.ID))
			fps, nonces, leases = append(fps, []byte("fp")), append(nonces, newNonce()), append(leases, time.Minute.Microseconds())
		}
		var mb, rb any
		if tombs {
			mb, rb = e.markerBottom(), e.recordBottom()
		}
		rows, err = tx.Query(bg, e.q.freshManyFn, locks, slocks, sids, scopes, ids, fps, nonces, leases, e.width, e.oldest(),
			e.nowArg(), e.q.injected, mb, rb, e.tombUS())
		n = 0
		if err == nil {
			for rows.Next() {
				n++
			}
			rows.Close()
			err = rows.Err()
		}
		if err != nil || n != 4 { // two keys locked, one with its record, one claimed
			t.Errorf("tombstones %v: batch: %d rows, %v", tombs, n, err)
		}
		_ = tx.Rollback(bg)
	}
}

// Finishes of many leases at once, some batched (finish.go), answer as finishes sent one
// by one: each lease's outcome, result and trace context are recorded and replayed, and a
// lease taken over meanwhile gets ErrLeaseLost and changes nothing, in a batch or alone.
func TestFinishBatch(t *testing.T) {
	for _, tombs := range []bool{true, false} {
		t.Run(fmt.Sprintf("tombstones=%v", tombs), func(t *testing.T) {
			leakCheck(t)
			clk, a, b := twoNodes(t, tombs)
			const n, lost = 120, 20
			tokens := make([]uint64, n)
			for i := range n {
				r := req(key(fmt.Sprintf("f-%d", i)), "fp")
				if i < lost {
					r.LeaseTTL = time.Second
				}
				tokens[i] = mustClaim(t, a.engine, r, driver.Claimed).Record.Token
			}
			clk.Advance(2 * time.Second)
			for i := range lost { // taken over on the other node
				mustClaim(t, b.engine, req(key(fmt.Sprintf("f-%d", i)), "fp"), driver.TookOver)
			}
			errs := make([]error, n)
			var wg sync.WaitGroup
			start := make(chan struct{})
			for i := range n {
				wg.Go(func() {
					<-start
					ctx := bg
					if i%5 != 0 { // some with a trace context, some without
						ctx = driver.WithTrace(bg, fmt.Appendf(nil, "trace-%d", i))
					}
					state := driver.Succeeded
					if i%3 == 0 {
						state = driver.Failed
					}
					rec, err := a.Finish(ctx, key(fmt.Sprintf("f-%d", i)), tokens[i], state, fmt.Appendf(nil, "r-%d", i))
					if err == nil && (rec.State != state || string(rec.Result) != fmt.Sprintf("r-%d", i) || rec.Token != tokens[i]) {
						err = fmt.Errorf("finished record %+v", rec)
					}
					errs[i] = err
				})
			}
			close(start)
			wg.Wait()
			for i, err := range errs {
				switch {
				case i < lost && !errors.Is(err, driver.ErrLeaseLost):
					t.Errorf("finish of a lease taken over (f-%d): %v, want ErrLeaseLost", i, err)
				case i >= lost && err != nil:
					t.Errorf("finish f-%d: %v", i, err)
				}
			}
			for i := range n {
				k := key(fmt.Sprintf("f-%d", i))
				rec, found, _, err := b.Lookup(bg, k)
				if err != nil || !found {
					t.Fatalf("lookup %v: %v %v", k, found, err)
				}
				if i < lost {
					if rec.State != driver.Pending || rec.Token == tokens[i] {
						t.Errorf("%v taken over, then finished by the old holder: %+v", k, rec)
					}
					continue
				}
				trace := fmt.Sprintf("trace-%d", i)
				if i%5 == 0 {
					trace = ""
				}
				if string(rec.Result) != fmt.Sprintf("r-%d", i) || string(rec.Trace) != trace {
					t.Errorf("%v: result %q, trace %q", k, rec.Result, rec.Trace)
				}
			}
			if tombs { // no finish wrote a marker: GC writes them (copyMarkers)
				if n := a.markerCount(t); n != 0 {
					t.Errorf("the finishes wrote %d markers", n)
				}
			}
			if a.finishes.batches.Load() == 0 {
				t.Errorf("%d concurrent finishes sent no batch", n)
			}
			// every lease still held was finished by a statement aimed at its partition, alone
			// or in a batch: no batch failed over to the parent's statement
			if got := a.finishInHits.Load(); got != n-lost {
				t.Errorf("finishes written by the aimed statements: %d, want %d", got, n-lost)
			}
			if f := a.batchFailures.Load(); f != 0 {
				t.Errorf("%d batches failed", f)
			}
			t.Logf("%d finishes, %d batches of two or more", n, a.finishes.batches.Load())
		})
	}
}

// A batch whose reply is lost after it committed: every first claim in it is recognised by
// its nonce (Claimed, once), and every finish by its outcome (finished), so callers get the
// answers a delivered reply would have given, with nothing written twice.
func TestBatchLostReply(t *testing.T) {
	leakCheck(t)
	d := newTestDB(t)
	o := engineOptions{}
	a, b := d.open(o), d.open(o)
	a.testLoseBatch = func() bool { return true }
	const n = 96
	tokens := make([]uint64, n)
	errs := make([]error, n)
	run := func(f func(i int) error) {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for i := range n {
			wg.Go(func() { <-start; errs[i] = f(i) })
		}
		close(start)
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%d: %v", i, err)
			}
		}
	}
	run(func(i int) error {
		res, err := a.Claim(bg, req(key(fmt.Sprintf("l-%d", i)), "fp"))
		if err == nil && res.Outcome != driver.Claimed {
			err = fmt.Errorf("claim: %v", res.Outcome)
		}
		tokens[i] = res.Record.Token
		return err
	})
	run(func(i int) error {
		_, err := a.Finish(bg, key(fmt.Sprintf("l-%d", i)), tokens[i], driver.Succeeded, fmt.Appendf(nil, "r-%d", i))
		return err
	})
	if a.claims.batches.Load() == 0 || a.finishes.batches.Load() == 0 {
		t.Fatalf("batches: %d claims, %d finishes", a.claims.batches.Load(), a.finishes.batches.Load())
	}
	if a.batchFailures.Load() == 0 { // every batch's reply was dropped: each counts as failed
		t.Fatal("no batch failure counted")
	}
	run(func(i int) error {
		res, err := b.Claim(bg, req(key(fmt.Sprintf("l-%d", i)), "fp"))
		if err == nil && (res.Outcome != driver.Replay || string(res.Record.Result) != fmt.Sprintf("r-%d", i) || res.Record.Token != tokens[i]) {
			err = fmt.Errorf("replay: %v %+v", res.Outcome, res.Record)
		}
		return err
	})
	var rows, keys int
	if err := a.pool.QueryRow(bg, `SELECT count(*), count(DISTINCT (scope, id)) FROM `+a.q.schema+`.records`).Scan(&rows, &keys); err != nil || rows != n || keys != n {
		t.Fatalf("records: %d rows of %d keys (%v), want %d", rows, keys, err, n)
	}
}

// Replays through the fast path of many keys at once, some read in one statement
// (replay.go), answer as reads one by one: a finished key replays its own result (or
// mismatches another fingerprint), a key past retention is left to the claim path (here:
// tombstoned).
func TestLookupBatch(t *testing.T) {
	leakCheck(t)
	d := newTestDB(t)
	clk := newClock()
	a := d.open(engineOptions{Now: clk.Now, Retention: time.Hour, TombstoneWindow: 2 * time.Hour})
	const n = 100
	finish := func(i int) {
		k := key(fmt.Sprintf("r-%d", i))
		c := mustClaim(t, a.engine, req(k, "fp"), driver.Claimed)
		state := driver.Succeeded
		if i%4 == 0 {
			state = driver.Failed
		}
		if _, err := a.Finish(bg, k, c.Record.Token, state, fmt.Appendf(nil, "res-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n / 2 {
		finish(i)
	}
	clk.Advance(30 * time.Minute)
	for i := n / 2; i < n; i++ {
		finish(i)
	}
	clk.Advance(31 * time.Minute) // the first half is past retention
	hits := a.replayFastHits.Load()
	type answer struct {
		res driver.ClaimResult
		err error
	}
	answers := make([]answer, 2*n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for j := range 2 * n {
		wg.Go(func() {
			<-start
			fp := "fp"
			if j >= n {
				fp = "other"
			}
			res, err := a.Claim(bg, req(key(fmt.Sprintf("r-%d", j%n)), fp))
			answers[j] = answer{res, err}
		})
	}
	close(start)
	wg.Wait()
	for j, got := range answers {
		i := j % n
		want := driver.Replay
		switch {
		case i < n/2:
			want = driver.Expired
		case j >= n:
			want = driver.Mismatch
		}
		if got.err != nil || got.res.Outcome != want {
			t.Errorf("claim r-%d (#%d): %v %v, want %v", i, j, got.res.Outcome, got.err, want)
			continue
		}
		if want == driver.Replay && string(got.res.Record.Result) != fmt.Sprintf("res-%d", i) {
			t.Errorf("replay r-%d: result %q", i, got.res.Record.Result)
		}
	}
	if got := a.replayFastHits.Load() - hits; got != n {
		t.Errorf("fast-path answers: %d, want %d (the finished keys' replays and mismatches)", got, n)
	}
	if a.lookups.batches.Load() == 0 {
		t.Errorf("%d concurrent replays sent no batch", 2*n)
	}
	if f := a.batchFailures.Load(); f != 0 {
		t.Errorf("%d batches failed", f)
	}
	t.Logf("%d claims, %d read batches", 2*n, a.lookups.batches.Load())
}

// The statements over arrays of keys run on a generic plan once PostgreSQL has seen them a
// few times, even for batches of a few keys (queries.go, param): each is prepared on a
// connection of its own and executed eight times with three keys (in a transaction rolled
// back) against a partition of 2,000 analyzed rows, and the server then reports generic
// plans for it. With the arrays' lengths visible to the planner, the batched lookup, and
// the batched finish without tombstones, were planned anew on every execution.
func TestBatchStatementsPlanOnce(t *testing.T) {
	for _, tombs := range []bool{true, false} {
		t.Run(fmt.Sprintf("tombstones=%v", tombs), func(t *testing.T) {
			clk, a, _ := twoNodes(t, tombs)
			e := a.engine
			c := mustClaim(t, e, req(key("done"), "fp"), driver.Claimed)
			rec, err := e.Finish(bg, key("done"), c.Record.Token, driver.Succeeded, []byte("r"))
			if err != nil {
				t.Fatal(err)
			}
			clk.Advance(time.Second)
			ep := e.epochOf(rec.UpdatedAt)
			// a partition of some size, its statistics known: probing it for a few keys is
			// then costed well below probing it for the generic plan's guess of 10
			if _, err := a.pool.Exec(bg, `INSERT INTO `+e.q.schema+`.records (scope, id, epoch, state, fp, token, attempts, nonce, created_at, updated_at)
SELECT 's', ('k' || i)::bytea, $1, 2, 'fp', 1000000 + i, 1, 'n', $2, $2 FROM generate_series(1, 2000) i`, ep, rec.UpdatedAt); err != nil {
				t.Fatal(err)
			}
			if _, err := a.pool.Exec(bg, `ANALYZE `+e.q.schema+`.records`); err != nil {
				t.Fatal(err)
			}
			scopes, ids := [][]byte{[]byte("s"), []byte("s"), []byte("s")}, [][]byte{[]byte("done"), []byte("x"), []byte("y")}
			stmts := []struct {
				name, sql string
				args      []any
			}{
				{"lookup_many", e.q.lookupManyIn(partName(famRecords, ep)), []any{scopes, ids, e.nowArg()}},
				{"finish_many", e.q.finishManyInSQL(ep, e.markerEpoch(ep)), []any{scopes, ids, []int64{1, 2, 3}, e.oldest(), e.retentionUS(), e.width, e.nowArg(),
					[]int16{2, 2, 2}, [][]byte{{}, {}, {}}, [][]byte{nil, nil, nil}}},
			}
			conn, err := pgx.Connect(bg, a.dsn)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(bg)
			for _, s := range stmts {
				if _, err := conn.Prepare(bg, s.name, s.sql); err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
			}
			for range 8 {
				tx, err := conn.Begin(bg)
				if err != nil {
					t.Fatal(err)
				}
				for _, s := range stmts {
					rows, err := tx.Query(bg, s.name, s.args...)
					if err == nil {
						rows.Close()
						err = rows.Err()
					}
					if err != nil {
						t.Fatalf("%s: %v", s.name, err)
					}
				}
				if err := tx.Rollback(bg); err != nil {
					t.Fatal(err)
				}
			}
			for _, s := range stmts {
				var generic, custom int64
				if err := conn.QueryRow(bg, `SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = $1`, s.name).Scan(&generic, &custom); err != nil {
					t.Fatalf("%s: %v", s.name, err)
				}
				if generic == 0 {
					t.Errorf("%s: %d custom plans and no generic one in 8 executions", s.name, custom)
				}
			}
		})
	}
}
