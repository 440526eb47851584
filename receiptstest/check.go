package receiptstest

import (
	"context"
	"testing"

	"github.com/receiptstore/receipts"
	"github.com/stretchr/testify/require"
)

var checkTests = []test{
	{"SoundStore", testCheckSoundStore},
}

// Check finds nothing wrong in a store that only the contract wrote to:
// receipts, failures, live and abandoned claims, released keys, records
// past retention, before and after GC and a restart. It reads every
// record, counts those past retention, honours ctx and returns ErrClosed
// after Close. (The Corrupt topic checks that it reports a corrupt
// record.) On an engine without a check, Check returns ErrUnsupported.
func testCheckSoundStore(t *testing.T, s Store) {
	e := newEnv(t, s, nil)
	if _, err := e.db.Check(bg); err != nil {
		require.ErrorIs(t, err, receipts.ErrUnsupported)
		t.Skip("the engine has no integrity check (ErrUnsupported)")
	}
	e.wantCheckOK()

	e.commit(key("a", "old"), "fp", "r")
	e.clock.Advance(retention / 2)
	e.commit(key("a", "ok"), "fp", "r")
	l := e.claim(key("a", "failed"), "fp")
	_, err := l.Fail(bg, []byte("no"))
	require.NoError(t, err)
	e.claim(key("b", "abandoned"), "fp")
	l = e.claim(key("b", "released"), "fp")
	require.NoError(t, l.Release(bg))
	e.clock.Advance(leaseTTL)
	e.claim(key("b", "live"), "fp")
	e.claim(key("b", "abandoned"), "fp") // a takeover
	rep := e.check()
	require.True(t, rep.OK(), "problems: %+v", rep.Problems)
	require.Equal(t, 5, rep.Records, "records read")
	require.Zero(t, rep.Expired)
	require.Positive(t, rep.Epochs)

	e.clock.Advance(retention/2 + leaseTTL) // "old" is past retention
	rep = e.check()
	require.True(t, rep.OK(), "problems: %+v", rep.Problems)
	require.Equal(t, e.expired(), int64(rep.Expired), "Check and Count agree on expired records")
	require.Equal(t, 1, rep.Expired)

	e.gc()
	e.wantCheckOK()
	e.reopen()
	e.wantCheckOK()

	ctx, cancel := context.WithCancel(bg)
	cancel()
	_, err = e.db.Check(ctx)
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, e.db.Close())
	_, err = e.db.Check(bg)
	require.ErrorIs(t, err, receipts.ErrClosed)
}
