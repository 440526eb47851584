package receipts_test

// Corrupt records on disk: garbage written under a record key (through
// db.Pebble(), using the layout in internal/keys) surfaces as ErrCorrupt from
// Lookup, Scan, Claim, Do, DoBatch and the lease methods, is never read as
// "absent" (that would hand out a second claim), is never overwritten, and
// the store keeps serving every other key.

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
)

// withCRC appends a valid CRC-32C, so that the bytes get past the checksum
// and reach the decoder.
func withCRC(b []byte) []byte {
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crc32.MakeTable(crc32.Castagnoli)))
}

func corruptValues() map[string][]byte {
	valid := encoding.EncodeRecord(&encoding.Record{
		State: encoding.StateSucceeded, Fingerprint: []byte("fp"), Result: []byte("result"),
		Attempts: 1, Token: 7, CreatedAt: receiptstest.DefaultStart.UnixNano(), UpdatedAt: receiptstest.DefaultStart.UnixNano(),
	})
	flipped := append([]byte{}, valid...)
	flipped[len(flipped)/2] ^= 0x40
	body := valid[2 : len(valid)-4]
	return map[string][]byte{
		"empty":            {},
		"one byte":         {1},
		"random":           []byte("\x8f\x13garbage\xff\x00\x01 that is not a record"),
		"truncated":        valid[:len(valid)-3],
		"flipped bit":      flipped,
		"unknown version":  withCRC(append([]byte{9, 3}, body...)),
		"unknown state":    withCRC(append([]byte{1, 0}, body...)),
		"state 200":        withCRC(append([]byte{1, 200}, body...)),
		"trailing bytes":   withCRC(append(append([]byte{1, 3}, body...), 0xc0)),
		"six fields":       withCRC(append([]byte{1, 3, 0x96}, body[1:]...)),
		"empty body":       withCRC([]byte{1, 3}),
		"not an array":     withCRC([]byte{1, 3, 0xc0}),
		"huge bin length":  withCRC([]byte{1, 3, 0x97, 0xc6, 0xff, 0xff, 0xff, 0xf0, 'f', 'p'}),
		"huge array":       withCRC([]byte{1, 3, 0xdd, 0xff, 0xff, 0xff, 0xff}),
		"empty fp":         withCRC([]byte{1, 3, 0x97, 0xc4, 0x00, 0xc0, 0x01, 0x07, 0x00, 0x00, 0x00}),
		"nil fp":           withCRC([]byte{1, 3, 0x97, 0xc0, 0xc0, 0x01, 0x07, 0x00, 0x00, 0x00}),
		"attempts too big": withCRC([]byte{1, 3, 0x97, 0xc4, 0x01, 'f', 0xc0, 0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x07, 0x00, 0x00, 0x00}),
		"map not bin":      withCRC([]byte{1, 3, 0x97, 0x80, 0xc0, 0x01, 0x07, 0x00, 0x00, 0x00}),
		"float token":      withCRC([]byte{1, 3, 0x97, 0xc4, 0x01, 'f', 0xc0, 0x01, 0xca, 0, 0, 0, 0, 0x00, 0x00, 0x00}),
	}
}

type corruptStore struct {
	db    *receipts.DB
	clock time.Time
}

func openCorruptStore(t *testing.T) *corruptStore {
	s := &corruptStore{clock: time.Unix(0, receiptstest.DefaultStart.UnixNano())}
	db, err := pebblestore.Open("db", &pebblestore.Options{
		Options: receipts.Options{
			Retention:  time.Hour,
			LeaseTTL:   time.Minute,
			EpochWidth: 15 * time.Minute,
			GCInterval: -1,
			Now:        func() time.Time { return s.clock },
		},
		Pebble: &pebble.Options{FS: vfs.NewMem()},
	})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	s.db = db
	return s
}

// recordKey finds the stored key of k's record (there must be one).
func (s *corruptStore) recordKey(t *testing.T, k receipts.Key) []byte {
	it, err := pebblestore.DB(s.db).NewIter(&pebble.IterOptions{LowerBound: keys.RecordsStart, UpperBound: keys.RecordsEnd})
	require.NoError(t, err)
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		_, scope, id, err := keys.ParseRecord(it.Key())
		require.NoError(t, err)
		if scope == k.Scope && id == k.ID {
			return append([]byte{}, it.Key()...)
		}
	}
	t.Fatalf("no record of %s", k)
	return nil
}

func (s *corruptStore) raw(t *testing.T, key []byte) []byte {
	v, closer, err := pebblestore.DB(s.db).Get(key)
	require.NoError(t, err)
	defer closer.Close()
	return append([]byte{}, v...)
}

func TestCorruptRecords(t *testing.T) {
	ctx := context.Background()
	for name, garbage := range corruptValues() {
		for _, where := range []string{"over a receipt", "over a claim", "no record before", "older epoch"} {
			t.Run(name+"/"+where, func(t *testing.T) {
				s := openCorruptStore(t)
				db := s.db
				bad := receipts.Key{Scope: "tenant", ID: "op-bad"}
				fp := []byte("fp")
				// Neighbours: the same scope, another scope, ids that are
				// prefixes of the bad one.
				good := []receipts.Key{{Scope: "tenant", ID: "op-a"}, {Scope: "tenant", ID: "op-bad2"}, {Scope: "tenan", ID: "top-bad"}, {Scope: "other", ID: "op-bad"}}
				for _, k := range good {
					_, err := db.Do(ctx, k, fp, func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("ok:" + k.ID), nil })
					require.NoError(t, err)
				}
				var held *receipts.Lease
				var key []byte
				switch where {
				case "over a receipt":
					_, err := db.Do(ctx, bad, fp, func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("r"), nil })
					require.NoError(t, err)
					key = s.recordKey(t, bad)
				case "over a claim":
					l, _, err := db.Claim(ctx, bad, fp)
					require.NoError(t, err)
					held, key = l, s.recordKey(t, bad)
				case "no record before":
					epoch := uint64(s.clock.UnixNano() / int64(15*time.Minute))
					key = keys.AppendRecord(nil, epoch, bad.Scope, bad.ID)
				case "older epoch": // a receipt written an epoch ago: lookups probe down to it
					_, err := db.Do(ctx, bad, fp, func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("r"), nil })
					require.NoError(t, err)
					key = s.recordKey(t, bad)
					s.clock = s.clock.Add(16 * time.Minute)
				}
				require.NoError(t, pebblestore.DB(db).Set(key, garbage, pebble.Sync))

				_, err := db.Lookup(ctx, bad)
				require.ErrorIs(t, err, receipts.ErrCorrupt, "Lookup")

				l, rc, err := db.Claim(ctx, bad, fp)
				require.ErrorIs(t, err, receipts.ErrCorrupt, "Claim")
				require.Nil(t, l, "a corrupt record must never hand out a claim")
				require.Nil(t, rc)

				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				_, _, err = db.Claim(wctx, bad, fp, receipts.WaitForResult())
				require.ErrorIs(t, err, receipts.ErrCorrupt, "Claim(WaitForResult)")

				called := false
				_, err = db.Do(ctx, bad, fp, func(context.Context, *receipts.Lease) ([]byte, error) { called = true; return nil, nil })
				require.ErrorIs(t, err, receipts.ErrCorrupt, "Do")
				_, err = pebblestore.DoBatch(ctx, db, bad, fp, func(context.Context, *receipts.Lease, *pebble.Batch) ([]byte, error) {
					called = true
					return nil, nil
				})
				require.ErrorIs(t, err, receipts.ErrCorrupt, "DoBatch")
				require.False(t, called, "fn ran for a corrupt record")

				if held != nil {
					require.ErrorIs(t, held.Renew(ctx), receipts.ErrCorrupt, "Renew")
					_, err = held.Commit(ctx, []byte("x"))
					require.ErrorIs(t, err, receipts.ErrCorrupt, "Commit")
					_, err = held.Fail(ctx, []byte("x"))
					require.ErrorIs(t, err, receipts.ErrCorrupt, "Fail")
					_, err = pebblestore.CommitWith(ctx, held, []byte("x"), func(b *pebble.Batch) error {
						called = true
						return b.Set([]byte("app/effect"), []byte("x"), nil)
					})
					require.ErrorIs(t, err, receipts.ErrCorrupt, "CommitWith")
					require.False(t, called, "effect applied over a corrupt record")
					require.ErrorIs(t, held.Release(ctx), receipts.ErrCorrupt, "Release")
				}

				// Scan reports the corrupt record and goes on.
				for _, f := range []receipts.Filter{{}, {Scope: "tenant"}, {State: receipts.Succeeded}} {
					var corrupt int
					got := map[receipts.Key]bool{}
					for rc, err := range db.Scan(ctx, f) {
						if err != nil {
							require.ErrorIs(t, err, receipts.ErrCorrupt, "Scan(%+v)", f)
							corrupt++
							continue
						}
						got[rc.Key] = true
					}
					require.Equal(t, 1, corrupt, "Scan(%+v): corrupt records reported", f)
					for _, k := range good {
						if f.Scope == "" || f.Scope == k.Scope {
							require.True(t, got[k], "Scan(%+v) lost %s", f, k)
						}
					}
				}
				require.Equal(t, int64(1), countOf(t, db).Corrupt, "Counts.Corrupt")
				rep, err := db.Check(ctx)
				require.NoError(t, err, "Check")
				require.Len(t, rep.Problems, 1, "Check: %+v", rep.Problems)
				require.Equal(t, bad.String(), rep.Problems[0].Key, "Check names the corrupt record")
				require.Contains(t, rep.Problems[0].What, "does not decode")
				epoch, _ := keys.Epoch(key)
				require.Equal(t, int64(epoch), rep.Problems[0].Epoch)

				// Nothing overwrote the bytes.
				require.Equal(t, garbage, s.raw(t, key), "corrupt record rewritten")
				_, closer, err := pebblestore.DB(db).Get([]byte("app/effect"))
				if err == nil {
					closer.Close()
				}
				require.True(t, errors.Is(err, pebble.ErrNotFound), "effect written")

				// Every other key is served: replays, new claims, GC.
				for _, k := range good {
					rc, err := db.Lookup(ctx, k)
					require.NoError(t, err, "Lookup %s", k)
					require.Equal(t, "ok:"+k.ID, string(rc.Result))
					_, rc, err = db.Claim(ctx, k, fp)
					require.NoError(t, err, "Claim %s", k)
					require.Equal(t, "ok:"+k.ID, string(rc.Result))
				}
				fresh := receipts.Key{Scope: "tenant", ID: "op-new"}
				rc, err = db.Do(ctx, fresh, fp, func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("new"), nil })
				require.NoError(t, err)
				require.Equal(t, "new", string(rc.Result))
				_, err = db.GC(ctx)
				require.NoError(t, err)
			})
		}
	}
}

// TestCorruptRecordKey: a key in the records range that does not parse is
// reported by Scan, which goes on with the others.
func TestCorruptRecordKey(t *testing.T) {
	ctx := context.Background()
	s := openCorruptStore(t)
	fp := []byte("fp")
	for _, id := range []string{"a", "b"} {
		_, err := s.db.Do(ctx, receipts.Key{Scope: "s", ID: id}, fp, func(context.Context, *receipts.Lease) ([]byte, error) { return []byte(id), nil })
		require.NoError(t, err)
	}
	epoch := uint64(s.clock.UnixNano() / int64(15*time.Minute))
	valid := encoding.EncodeRecord(&encoding.Record{State: encoding.StateSucceeded, Fingerprint: fp, Result: []byte{}, Attempts: 1, Token: 1, CreatedAt: receiptstest.DefaultStart.UnixNano(), UpdatedAt: receiptstest.DefaultStart.UnixNano()})
	for _, tail := range [][]byte{{0}, {0, 'x'}, {200, 'x'}, {1, 's'}} { // scope length 0, too long, empty id
		require.NoError(t, pebblestore.DB(s.db).Set(append(keys.EpochStart(epoch), tail...), valid, pebble.Sync))
	}
	var corrupt, ok int
	for _, err := range s.db.Scan(ctx, receipts.Filter{}) {
		if err != nil {
			require.ErrorIs(t, err, receipts.ErrCorrupt)
			corrupt++
			continue
		}
		ok++
	}
	require.Equal(t, 4, corrupt)
	require.Equal(t, 2, ok)
}
