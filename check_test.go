package receipts_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// TestCheckFindsLayoutProblems: DB.Check reports, by key and epoch, every
// kind of damage to the key layout and the store's own data that a bad
// write or a bad restore could leave, on a live Pebble store, and nothing in
// a sound one (an expired older copy of a key included: GC drops it).
func TestCheckFindsLayoutProblems(t *testing.T) {
	ctx := context.Background()
	s := openCorruptStore(t)
	db, p := s.db, pebblestore.DB(s.db)
	const width = int64(15 * time.Minute)
	fp := []byte("fp")
	for _, id := range []string{"moved", "copied", "fine"} {
		_, err := db.Do(ctx, receipts.Key{Scope: "s", ID: id}, fp, func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("r"), nil })
		require.NoError(t, err)
	}
	rep, err := db.Check(ctx)
	require.NoError(t, err)
	require.True(t, rep.OK(), "a sound store: %+v", rep.Problems)
	require.Equal(t, 3, rep.Records)
	require.Equal(t, 1, rep.Epochs)
	require.Equal(t, 15*time.Minute, rep.EpochWidth)
	require.Positive(t, rep.TokenCeiling)

	now := uint64(s.clock.UnixNano() / width)
	at := func(id string) []byte { return s.recordKey(t, receipts.Key{Scope: "s", ID: id}) }
	rec := func(r encoding.Record) []byte {
		if r.Fingerprint == nil {
			r.Fingerprint = fp
		}
		if r.State != encoding.StatePending && r.Result == nil {
			r.Result = []byte{}
		}
		return encoding.EncodeRecord(&r)
	}
	set := func(k, v []byte) { require.NoError(t, p.Set(k, v, pebble.Sync)) }
	ts := s.clock.UnixNano()
	ok := encoding.Record{State: encoding.StateSucceeded, Attempts: 1, Token: 1, CreatedAt: ts, UpdatedAt: ts}

	// "moved" sits three epochs ahead of its last write (and of now).
	moved := at("moved")
	v := s.raw(t, moved)
	require.NoError(t, p.Delete(moved, pebble.Sync))
	keys.SetEpoch(moved, now+3)
	set(moved, v)
	// "copied" is in the current epoch and, visible, in the one before.
	copied := at("copied")
	keys.SetEpoch(copied, now-1)
	set(copied, rec(encoding.Record{State: encoding.StateSucceeded, Attempts: 1, Token: 1, CreatedAt: ts - width, UpdatedAt: ts - width}))
	// An expired older copy of "fine" is no problem.
	old := at("fine")
	keys.SetEpoch(old, now-8)
	set(old, rec(encoding.Record{State: encoding.StateSucceeded, Attempts: 1, Token: 1, CreatedAt: ts - 2*int64(time.Hour), UpdatedAt: ts - 2*int64(time.Hour)}))
	// Records that decode but do not hold together.
	k := func(id string) []byte { return keys.AppendRecord(nil, now, "bad", id) }
	set(k("attempts"), rec(encoding.Record{State: encoding.StateSucceeded, Token: 1, CreatedAt: ts, UpdatedAt: ts}))
	set(k("created"), rec(encoding.Record{State: encoding.StateSucceeded, Attempts: 1, Token: 1, CreatedAt: ts + 1, UpdatedAt: ts}))
	set(k("lease"), rec(encoding.Record{State: encoding.StatePending, Attempts: 1, Token: 1, CreatedAt: ts, UpdatedAt: ts}))
	set(k("token"), rec(encoding.Record{State: encoding.StateSucceeded, Attempts: 1, Token: 1 << 40, CreatedAt: ts, UpdatedAt: ts}))
	set(k("garbage"), []byte("garbage"))
	// A key the store never writes, and a record key that does not parse.
	set([]byte(keys.Prefix+"zz"), []byte("?"))
	set(append(keys.EpochStart(now), 0), rec(ok))

	rep, err = db.Check(ctx)
	require.NoError(t, err)
	type found struct {
		key   string
		epoch int64
	}
	got := map[found][]string{}
	for _, p := range rep.Problems {
		got[found{p.Key, p.Epoch}] = append(got[found{p.Key, p.Epoch}], p.What)
	}
	e := func(n uint64) int64 { return int64(n) }
	want := map[found][]string{
		{`"s"/"moved"`, e(now + 3)}:                                  {"more than one epoch ahead of now", "last written at"},
		{`"s"/"copied"`, e(now)}:                                     {"stored twice, also in epoch"},
		{`"bad"/"attempts"`, e(now)}:                                 {"attempts is 0"},
		{`"bad"/"created"`, e(now)}:                                  {"created after its last write"},
		{`"bad"/"lease"`, e(now)}:                                    {"pending without a lease expiry"},
		{`"bad"/"token"`, e(now)}:                                    {"not below the token ceiling"},
		{`"bad"/"garbage"`, e(now)}:                                  {"does not decode"},
		{`"\x00rcptzz"`, -1}:                                         {"unknown key under the store's reserved prefix"},
		{strconv.Quote(string(append(keys.EpochStart(now), 0))), -1}: {"malformed record key"},
	}
	require.Len(t, got, len(want), "problems: %+v", rep.Problems)
	for f, whats := range want {
		require.Len(t, got[f], len(whats), "%v: %v", f, got[f])
		for i, w := range whats {
			require.Contains(t, got[f][i], w, "%v", f)
		}
	}
	require.Equal(t, 3+2+5+1, rep.Records, "record keys read: 3, 2 older copies, 5 bad, 1 malformed (the unknown key is not a record)")
	require.Equal(t, 1, rep.Expired)

	// A GC floor above a record's epoch, and a meta record that does not
	// decode.
	set(keys.GCFloor, encoding.EncodeUint64(now+1))
	set(keys.Meta, []byte("R\x01garbage-garbage"))
	rep, err = db.Check(ctx)
	require.NoError(t, err)
	var floor, meta int
	for _, p := range rep.Problems {
		switch {
		case p.Key == "meta":
			require.Contains(t, p.What, "does not decode")
			meta++
		case p.Key == `"s"/"fine"` && p.Epoch == e(now):
			require.Contains(t, p.What, "below the GC floor")
			floor++
		}
	}
	require.Equal(t, 1, meta, "meta: %+v", rep.Problems)
	require.Equal(t, 1, floor, "below the floor: %+v", rep.Problems)
	require.Zero(t, rep.EpochWidth, "the meta is unreadable")
}
