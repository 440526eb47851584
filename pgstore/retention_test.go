package pgstore

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/receiptstore/receipts/driver"
)

func (n *node) partitionEpochs(t *testing.T) map[int64]bool {
	t.Helper()
	ps, err := n.partitions(bg)
	if err != nil {
		t.Fatal(err)
	}
	out := map[int64]bool{}
	for _, p := range ps {
		if p.family == famRecords {
			out[p.epoch] = p.attached
		}
	}
	return out
}

// Retention is exact at read time by the (injected) database clock, whatever GC did.
func TestRetentionExactAtReadTime(t *testing.T) {
	clk := newClock()
	// tombstones off: the key is claimed again right after retention
	e := newTestDB(t).open(engineOptions{Now: clk.Now, Retention: 4 * time.Hour, TombstoneWindow: -1})
	k := key("ret")
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	clk.Advance(time.Hour)
	fin, err := e.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("r"))
	if err != nil {
		t.Fatal(err)
	}
	if !fin.ExpiresAt.Equal(clk.Now().Add(4 * time.Hour)) {
		t.Fatalf("expires %v", fin.ExpiresAt)
	}
	clk.Advance(4*time.Hour - time.Microsecond)
	if _, found, _, err := e.Lookup(bg, k); err != nil || !found {
		t.Fatalf("1 µs before expiry: found %v %v", found, err)
	}
	mustClaim(t, e.engine, req(k, "other"), driver.Mismatch)
	clk.Advance(time.Microsecond)
	if _, found, _, err := e.Lookup(bg, k); err != nil || found {
		t.Fatalf("at expiry: found %v %v", found, err)
	}
	n := 0
	for _, err := range e.Scan(bg, driver.Filter{}) {
		if err != nil {
			t.Fatal(err)
		}
		n++
	}
	if n != 0 {
		t.Fatalf("scan at expiry: %d records", n)
	}
	// an expired record is absent: a claim (any fingerprint) starts afresh at attempt 1
	c2 := mustClaim(t, e.engine, req(k, "other"), driver.Claimed)
	if c2.Record.Attempts != 1 || c2.Record.Token <= c.Record.Token || !c2.Record.CreatedAt.Equal(clk.Now()) {
		t.Fatalf("claim over an expired record: %+v", c2.Record)
	}
	// an abandoned claim is visible for Retention after its last write too
	if err := e.Abandon(bg, k, c2.Record.Token); err != nil {
		t.Fatal(err)
	}
	clk.Advance(4*time.Hour - time.Microsecond)
	if rec, found, _, _ := e.Lookup(bg, k); !found || rec.State != driver.Pending {
		t.Fatalf("abandoned claim before expiry: %+v %v", rec, found)
	}
	clk.Advance(time.Microsecond)
	if _, found, _, _ := e.Lookup(bg, k); found {
		t.Fatal("abandoned claim visible past retention")
	}
}

// Partitions are created ahead, a claim that finds none creates it, and GC drops dead ones
// with O(partitions) statements however many records they hold.
func TestPartitionsAheadAndGC(t *testing.T) {
	clk := newClock()
	const width = time.Hour
	e := newTestDB(t).open(engineOptions{Now: clk.Now, Retention: 4 * width, EpochWidth: width})
	cur := e.epochOf(clk.Now())
	got := e.partitionEpochs(t)
	for ep := cur; ep <= cur+2; ep++ {
		if !got[ep] {
			t.Fatalf("partition %d not created ahead (have %v)", ep, got)
		}
	}
	// jump past the partitions made ahead: the claim creates its own
	clk.Advance(5 * width)
	k := key("jump")
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	if !e.partitionEpochs(t)[cur+5] {
		t.Fatal("claim did not create its partition")
	}
	if _, err := e.Finish(bg, k, c.Record.Token, driver.Succeeded, nil); err != nil {
		t.Fatal(err)
	}

	// many records in one old epoch, one record per epoch in a few others
	const many = 2000
	if _, err := e.pool.Exec(bg, `INSERT INTO `+e.q.schema+`.records
SELECT 's'::bytea, ('m' || g)::bytea, $1::bigint, 2, 'fp', nextval('`+e.q.schema+`.token_seq'), 1, 'n', $2::timestamptz, $2::timestamptz, NULL, 'x'
  FROM generate_series(1, $3::int) g`, cur, clk.Now().Add(-5*width), many); err != nil {
		t.Fatal(err)
	}
	before := e.partitionEpochs(t)
	clk.Advance(5 * width) // now cur+10: epochs <= cur+5 end by cur+6, dead at cur+10
	st, err := e.GC(bg)
	if err != nil {
		t.Fatal(err)
	}
	after := e.partitionEpochs(t)
	dropped := 0
	for ep := range before {
		if !after[ep] {
			dropped++
			if ep > cur+5 {
				t.Errorf("live partition %d dropped", ep)
			}
		} else if ep <= cur+5 {
			t.Errorf("dead partition %d kept", ep)
		}
	}
	if st.EpochsDropped != dropped || dropped < 4 {
		t.Fatalf("stats %+v, dropped %d", st, dropped)
	}
	// per dead partition: the lease's renewal, its markers' copy, DETACH and DROP
	if st.Writes > 1+4*st.EpochsDropped || st.BytesFreed == 0 {
		t.Fatalf("GC cost %+v: want O(partitions) statements", st)
	}
	if st.MarkersWritten < many { // tombstones on (7 × Retention): every dropped record's marker
		t.Fatalf("GC wrote %d markers for %d dropped records", st.MarkersWritten, many)
	}
	now := e.epochOf(clk.Now())
	for ep := now; ep <= now+2; ep++ {
		if !after[ep] {
			t.Fatalf("GC did not create partition %d ahead", ep)
		}
	}
	var n int
	if err := e.pool.QueryRow(bg, `SELECT count(*) FROM `+e.q.schema+`.records`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("records left: %d %v", n, err)
	}
	t.Logf("GC: %+v", st)
}

// One node at a time holds the maintenance lease; another takes over once it has run out.
func TestMaintenanceLeaseTakeover(t *testing.T) {
	clk := newClock()
	d := newTestDB(t)
	o := engineOptions{Now: clk.Now, Retention: 4 * time.Hour, EpochWidth: time.Hour, MaintLease: 24 * time.Hour}
	a, b := d.open(o), d.open(o)
	owner := func() string {
		var s string
		if err := a.pool.QueryRow(bg, `SELECT coalesce(maint_owner, '') FROM `+a.q.schema+`.meta`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	if _, err := a.GC(bg); err != nil {
		t.Fatal(err)
	}
	if owner() != a.me {
		t.Fatal("a does not hold the lease")
	}
	clk.Advance(10 * time.Hour) // partitions of the first epochs are now dead
	st, err := b.GC(bg)
	if err != nil {
		t.Fatal(err)
	}
	if st.EpochsDropped != 0 || owner() != a.me {
		t.Fatalf("b ran GC while a's lease was live? %+v owner %s", st, owner())
	}
	// a "crashed": its lease runs out, b takes over
	clk.Advance(15 * time.Hour)
	st, err = b.GC(bg)
	if err != nil {
		t.Fatal(err)
	}
	if owner() != b.me || st.EpochsDropped == 0 {
		t.Fatalf("b did not take over: %+v owner %s", st, owner())
	}
	// now a is the one kept out
	if st, err := a.GC(bg); err != nil || st.EpochsDropped != 0 || owner() != b.me {
		t.Fatalf("a after takeover: %+v %v", st, err)
	}
}

// A DETACH … CONCURRENTLY interrupted in its wait phase leaves the partition "detach
// pending"; the next GC finishes it (FINALIZE) and drops it. A detached leftover (crash
// between DETACH and DROP) is dropped too.
func TestGCFinalizesInterruptedDetach(t *testing.T) {
	clk := newClock()
	e := newTestDB(t).open(engineOptions{Now: clk.Now, Retention: 4 * time.Hour, EpochWidth: time.Hour})
	cur := e.epochOf(clk.Now())

	// cur: interrupted. A transaction that has used the parent keeps DETACH CONCURRENTLY
	// waiting after its first (committed) step; a statement timeout interrupts it there.
	holder, err := e.pool.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(bg, `SELECT count(*) FROM `+e.q.schema+`.records`); err != nil {
		t.Fatal(err)
	}
	conn, err := e.pool.Acquire(bg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(bg, "SET statement_timeout = '300ms'"); err != nil {
		t.Fatal(err)
	}
	_, err = conn.Exec(bg, `ALTER TABLE `+e.q.schema+`.records DETACH PARTITION `+e.q.schema+`.`+partName(famRecords, cur)+` CONCURRENTLY`)
	if err == nil {
		t.Fatal("detach was not interrupted")
	}
	_, _ = conn.Exec(bg, "RESET statement_timeout")
	conn.Release()
	_ = holder.Rollback(bg)
	ps, _ := e.partitions(bg)
	pending := false
	for _, p := range ps {
		pending = pending || (p.epoch == cur && p.pending)
	}
	if !pending {
		t.Fatalf("partition %d not left detach-pending: %+v", cur, ps)
	}

	// cur+1: detached but not dropped
	if _, err := e.pool.Exec(bg, `ALTER TABLE `+e.q.schema+`.records DETACH PARTITION `+e.q.schema+`.`+partName(famRecords, cur+1)); err != nil {
		t.Fatal(err)
	}
	clk.Advance(10 * time.Hour)
	st, err := e.GC(bg)
	if err != nil {
		t.Fatal(err)
	}
	left := e.partitionEpochs(t)
	if _, ok := left[cur]; ok {
		t.Fatal("interrupted detach not finished and dropped")
	}
	if _, ok := left[cur+1]; ok {
		t.Fatal("detached leftover not dropped")
	}
	t.Logf("GC: %+v", st)
}

// Claims on two nodes that all find their partition missing create it once between them.
func TestMissingPartitionConcurrentClaims(t *testing.T) {
	clk := newClock()
	d := newTestDB(t)
	o := engineOptions{Now: clk.Now, Retention: 4 * time.Hour, EpochWidth: time.Hour}
	a, b := d.open(o), d.open(o)
	clk.Advance(10 * time.Hour)
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func(e *engine) {
			defer wg.Done()
			if _, err := e.Claim(bg, req(key(fmt.Sprint("mp", i)), "fp")); err != nil {
				t.Error(err)
			}
		}([]*engine{a.engine, b.engine}[i%2])
	}
	wg.Wait()
	if !a.partitionEpochs(t)[a.epochOf(clk.Now())] {
		t.Fatal("partition missing")
	}
}

// Every write moves the record to the partition of its last write, so GC dropping the
// partition of its claim keeps a renewed claim alive, and its holder can still finish.
func TestRenewMovesRecordPastGC(t *testing.T) {
	clk := newClock()
	e := newTestDB(t).open(engineOptions{Now: clk.Now, Retention: 4 * time.Hour, EpochWidth: time.Hour})
	k := key("move")
	first := e.epochOf(clk.Now())
	c := mustClaim(t, e.engine, req(k, "fp"), driver.Claimed)
	for i := 0; i < 7; i++ { // renew every 30 min for 3.5 h
		clk.Advance(30 * time.Minute)
		rec, err := e.Renew(bg, k, c.Record.Token, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if !rec.LeaseExpiresAt.Equal(clk.Now().Add(time.Hour)) {
			t.Fatalf("lease %v", rec.LeaseExpiresAt)
		}
	}
	clk.Advance(90 * time.Minute) // 5 h after the claim: its first partition is dead
	st, err := e.GC(bg)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := e.partitionEpochs(t)[first]; ok || st.EpochsDropped == 0 {
		t.Fatalf("first partition kept: %+v", st)
	}
	rec, found, _, err := e.Lookup(bg, k)
	if err != nil || !found || rec.Token != c.Record.Token {
		t.Fatalf("renewed claim after GC: %+v %v %v", rec, found, err)
	}
	if _, err := e.Finish(bg, k, c.Record.Token, driver.Succeeded, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, e.engine, req(k, "fp"), driver.Replay)
}
