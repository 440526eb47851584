package receiptstest

import (
	"context"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

// Corrupter is implemented by a Store that can damage a stored record, as
// a failing disk or a bad write would. The Corrupt topic runs only on such
// a Store (it skips otherwise).
type Corrupter interface {
	// Corrupt overwrites the stored record of k in db (there is one) with
	// bytes that do not decode as a record, durably.
	Corrupt(t testing.TB, db *receipts.DB, k receipts.Key)
}

var corruptTests = []test{
	{"OverAReceipt", func(t *testing.T, s Store) { testCorrupt(t, s, false) }},
	{"OverAClaim", func(t *testing.T, s Store) { testCorrupt(t, s, true) }},
}

// A corrupt record surfaces as ErrCorrupt from Lookup, Claim, Do and the
// lease methods; it is never read as absent (that would hand out a second
// claim) nor overwritten; Scan reports it and goes on; every other key is
// served.
func testCorrupt(t *testing.T, s Store, overClaim bool) {
	c, ok := s.(Corrupter)
	if !ok {
		t.Skip("the Store does not implement receiptstest.Corrupter")
	}
	e := newEnv(t, s, nil)
	bad := key("tenant", "op-bad")
	// Neighbours: the same scope, another scope, ids that are prefixes of
	// the bad one.
	good := []receipts.Key{key("tenant", "op-a"), key("tenant", "op-bad2"), key("tenan", "top-bad"), key("other", "op-bad")}
	for _, k := range good {
		e.commit(k, "fp", "ok:"+k.ID)
	}
	var held *receipts.Lease
	if overClaim {
		held = e.claim(bad, "fp")
	} else {
		e.commit(bad, "fp", "r")
	}
	e.wantCheckOK()
	c.Corrupt(t, e.db, bad)

	check := func() {
		t.Helper()
		_, err := e.db.Lookup(bg, bad)
		require.ErrorIs(t, err, receipts.ErrCorrupt, "Lookup")
		l, r, err := e.db.Claim(bg, bad, []byte("fp"))
		require.ErrorIs(t, err, receipts.ErrCorrupt, "Claim")
		require.Nil(t, l, "a corrupt record must never hand out a claim")
		require.Nil(t, r)
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		defer cancel()
		_, _, err = e.db.Claim(ctx, bad, []byte("fp"), receipts.WaitForResult())
		require.ErrorIs(t, err, receipts.ErrCorrupt, "Claim(WaitForResult)")
		_, err = e.db.Do(bg, bad, []byte("fp"), mustNotRun(t))
		require.ErrorIs(t, err, receipts.ErrCorrupt, "Do")
		e.clock.Advance(leaseTTL) // not taken over as an abandoned claim either
		_, _, err = e.db.Claim(bg, bad, []byte("fp"))
		require.ErrorIs(t, err, receipts.ErrCorrupt, "Claim after the lease")

		// Scan reports the corrupt record and goes on.
		for _, f := range []receipts.Filter{{}, {Scope: "tenant"}, {State: receipts.Succeeded}} {
			corrupt := 0
			got := map[receipts.Key]bool{}
			for r, err := range e.db.Scan(bg, f) {
				if err != nil {
					require.ErrorIs(t, err, receipts.ErrCorrupt, "Scan(%+v)", f)
					corrupt++
					continue
				}
				got[r.Key] = true
			}
			require.Equal(t, 1, corrupt, "Scan(%+v): corrupt records reported", f)
			for _, k := range good {
				if f.Scope == "" || f.Scope == k.Scope {
					require.True(t, got[k], "Scan(%+v) lost %s", f, k)
				}
			}
		}
		require.Equal(t, int64(1), e.count().Corrupt, "Counts.Corrupt")
		if rep := e.check(); rep != nil {
			require.Len(t, rep.Problems, 1, "Check: %+v", rep.Problems)
			require.Equal(t, bad.String(), rep.Problems[0].Key, "Check names the corrupt record")
			require.Equal(t, len(good)+1, rep.Records, "Check reads every record")
		}

		// Every other key is served.
		for _, k := range good {
			require.Equal(t, "ok:"+k.ID, string(e.lookup(k).Result))
			require.Equal(t, "ok:"+k.ID, string(e.replay(k, "fp").Result))
		}
	}
	check()
	if held != nil {
		require.ErrorIs(t, held.Renew(bg), receipts.ErrCorrupt, "Renew")
		_, err := held.Commit(bg, []byte("x"))
		require.ErrorIs(t, err, receipts.ErrCorrupt, "Commit")
		_, err = held.Fail(bg, []byte("x"))
		require.ErrorIs(t, err, receipts.ErrCorrupt, "Fail")
		require.ErrorIs(t, held.Release(bg), receipts.ErrCorrupt, "Release")
		require.ErrorIs(t, held.Abandon(bg), receipts.ErrCorrupt, "Abandon")
	}
	e.gc()
	check() // nothing overwrote it
	e.reopen()
	check() // nor does a restart heal it
	e.commit(key("tenant", "op-new"), "fp", "new")
}
