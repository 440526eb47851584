package pgstore

import (
	"testing"
	"time"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/receiptstest"
)

// A node that crashed recorded its time nowhere (no Close, no GC pass wrote meta.clock): a
// node started afterwards with its clock an hour behind still resumes from the start of the
// newest partition holding records, so its writes do not start their windows in the past.
func TestClockResumesFromRecordsAfterCrash(t *testing.T) {
	d := newTestDB(t)
	clock := newClock() // 12:00, on a 15-minute boundary
	start := clock.Now()
	o := engineOptions{Retention: time.Hour, EpochWidth: 15 * time.Minute}
	o.Now = clock.Now
	a := d.open(o)
	clock.Advance(40 * time.Minute)
	l := mustClaim(t, a.engine, req(key("x"), "fp"), driver.Claimed)
	if _, err := a.Finish(bg, key("x"), l.Record.Token, driver.Succeeded, []byte("ok")); err != nil {
		t.Fatal(err)
	}
	// a never closes before b opens: a crash, as far as meta is concerned
	var recorded *time.Time
	if err := a.pool.QueryRow(bg, `SELECT clock FROM `+a.q.schema+`.meta`).Scan(&recorded); err != nil || recorded != nil {
		t.Fatalf("meta.clock %v, %v: want none recorded yet", recorded, err)
	}

	behind := receiptstest.NewClock(start.Add(-20 * time.Minute))
	o.Now = behind.Now
	b := d.open(o)
	floor := start.Add(30 * time.Minute) // the start of x's epoch
	now, err := b.Now(bg)
	if err != nil || now.Before(floor) {
		t.Fatalf("Now %s after a restart behind the clock, want >= %s (%v)", now, floor, err)
	}
	res := mustClaim(t, b.engine, req(key("y"), "fp"), driver.Claimed)
	if res.Record.UpdatedAt.Before(floor) || !res.Record.LeaseExpiresAt.Equal(res.Record.UpdatedAt.Add(30*time.Second)) {
		t.Fatalf("claim after the restart: %+v, want written at >= %s", res.Record, floor)
	}

	// Close records the engine's time; the next open resumes from it exactly.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	c := d.open(o)
	if now, err := c.Now(bg); err != nil || now.Before(res.Now) {
		t.Fatalf("Now %s after Close recorded %s (%v)", now, res.Now, err)
	}
}

// On the database's clock too, the engine's time never runs backwards: every statement's time
// is at least the engine's high-water mark (here pushed an hour ahead of the database's, as
// if the database's clock had stepped back an hour), and a reopen resumes from meta.clock.
func TestDatabaseClockNeverRunsBackwards(t *testing.T) {
	d := newTestDB(t)
	a := d.open(engineOptions{})
	ahead := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	a.raise(ahead.UnixNano())
	res := mustClaim(t, a.engine, req(key("x"), "fp"), driver.Claimed)
	if res.Now.Before(ahead) || res.Record.UpdatedAt.Before(ahead) || res.Record.LeaseExpiresAt.Before(ahead.Add(30*time.Second)) {
		t.Fatalf("claim with the database's clock an hour behind the engine's time %s: %+v at %s", ahead, res.Record, res.Now)
	}
	rec, found, now, err := a.Lookup(bg, key("x"))
	if err != nil || !found || now.Before(ahead) || rec.Token != res.Record.Token {
		t.Fatalf("lookup: %+v %v at %s, %v", rec, found, now, err)
	}
	if _, err := a.Finish(bg, key("x"), res.Record.Token, driver.Succeeded, nil); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := d.open(engineOptions{})
	if now, err := b.Now(bg); err != nil || now.Before(ahead) {
		t.Fatalf("Now %s after a reopen, want >= %s (%v)", now, ahead, err)
	}
}
