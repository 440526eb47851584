package receipts_test

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

const week = 7 * 24 * time.Hour

func openSettings(t *testing.T, fs vfs.FS, retention, ttl time.Duration, readOnly bool) *receipts.DB {
	t.Helper()
	db, err := pebblestore.Open("db", &pebblestore.Options{
		Options: receipts.Options{
			Retention:  retention,
			LeaseTTL:   ttl,
			GCInterval: -1,
		},
		Pebble: &pebble.Options{FS: fs, ReadOnly: readOnly},
	})
	require.NoError(t, err)
	return db
}

func storedMeta(t *testing.T, db *receipts.DB) *encoding.Meta {
	t.Helper()
	v, closer, err := pebblestore.DB(db).Get(keys.Meta)
	require.NoError(t, err)
	defer closer.Close()
	m, err := encoding.DecodeMeta(v)
	require.NoError(t, err)
	return m
}

func requireSettings(t *testing.T, db *receipts.DB, retention, ttl time.Duration) {
	t.Helper()
	o := db.Options()
	require.Equal(t, retention, o.Retention, "Retention in force")
	require.Equal(t, ttl, o.LeaseTTL, "LeaseTTL in force")
	s := db.Stats()
	require.Equal(t, retention, s.Retention)
	require.Equal(t, ttl, s.LeaseTTL)
}

// TestStoreRecordsRetention: the store records the Retention and LeaseTTL it
// was opened with; an open that leaves them zero uses the recorded ones; an
// open with other values records those, durably.
func TestStoreRecordsRetention(t *testing.T) {
	fs := vfs.NewCrashableMem()
	db := openSettings(t, fs, week, time.Minute, false)
	requireSettings(t, db, week, time.Minute)
	require.NoError(t, db.Close())

	for _, readOnly := range []bool{true, false} {
		db = openSettings(t, fs, 0, 0, readOnly)
		requireSettings(t, db, week, time.Minute)
		require.NoError(t, db.Close())
	}

	// Other values are recorded, synced: a crash right after Open keeps them.
	db = openSettings(t, fs, 48*time.Hour, 2*time.Minute, false)
	requireSettings(t, db, 48*time.Hour, 2*time.Minute)
	image := fs.CrashClone(vfs.CrashCloneCfg{})
	require.NoError(t, db.Close())
	db = openSettings(t, image, 0, 0, false)
	requireSettings(t, db, 48*time.Hour, 2*time.Minute)
	require.NoError(t, db.Close())

	// One of the two given: the other is the recorded one.
	db = openSettings(t, fs, 0, 5*time.Minute, false)
	requireSettings(t, db, 48*time.Hour, 5*time.Minute)
	require.NoError(t, db.Close())

	// A read-only open uses other values without recording them.
	db = openSettings(t, fs, time.Hour, time.Second, true)
	requireSettings(t, db, time.Hour, time.Second)
	require.NoError(t, db.Close())
	db = openSettings(t, fs, 0, 0, true)
	requireSettings(t, db, 48*time.Hour, 5*time.Minute)
	require.NoError(t, db.Close())

	// A recorded LeaseTTL that the given Retention cannot hold is refused,
	// and nothing changes.
	_, err := pebblestore.Open("db", &pebblestore.Options{Options: receipts.Options{Retention: 4 * time.Minute, GCInterval: -1}, Pebble: &pebble.Options{FS: fs}})
	require.ErrorIs(t, err, receipts.ErrInvalidOptions)
	db = openSettings(t, fs, 0, 0, false)
	requireSettings(t, db, 48*time.Hour, 5*time.Minute)
	require.NoError(t, db.Close())

	// A new store records the defaults.
	db = openSettings(t, vfs.NewMem(), 0, 0, false)
	requireSettings(t, db, receipts.DefaultRetention, receipts.DefaultLeaseTTL)
	m := storedMeta(t, db)
	require.Equal(t, int64(receipts.DefaultRetention), m.Retention)
	require.Equal(t, int64(receipts.DefaultLeaseTTL), m.LeaseTTL)
	require.NoError(t, db.Close())
}

// TestFormat1StoreOpens: a store whose meta was written by the previous
// format (no Retention, no LeaseTTL) opens, read-only as it is, and is
// upgraded by a writable open, keeping its epoch width, secret and records.
func TestFormat1StoreOpens(t *testing.T) {
	fs := vfs.NewMem()
	db := openSettings(t, fs, week, time.Minute, false)
	fp := []byte("fp")
	l, _, err := db.Claim(bg, key("s", "id"), fp)
	require.NoError(t, err)
	_, err = l.Commit(bg, []byte("done"))
	require.NoError(t, err)
	l, _, err = db.Claim(bg, key("s", "other"), fp)
	require.NoError(t, err)
	providerKey := l.ProviderKey()
	require.NoError(t, l.Release(bg))
	// Rewrite the meta as the format-1 version wrote it.
	m := storedMeta(t, db)
	old := encoding.Meta{Format: 1, EpochWidth: m.EpochWidth, Secret: m.Secret, CreatedAt: m.CreatedAt}
	b, err := encoding.EncodeMeta(&old)
	require.NoError(t, err)
	require.NoError(t, pebblestore.DB(db).Set(keys.Meta, b, pebble.Sync))
	require.NoError(t, pebblestore.DB(db).Flush())
	require.NoError(t, db.Close())

	// Read-only: the defaults (nothing recorded), the meta untouched.
	db = openSettings(t, fs, 0, 0, true)
	requireSettings(t, db, receipts.DefaultRetention, receipts.DefaultLeaseTTL)
	require.Equal(t, 1, storedMeta(t, db).Format)
	r, err := db.Lookup(bg, key("s", "id"))
	require.NoError(t, err)
	require.Equal(t, "done", string(r.Result))
	require.NoError(t, db.Close())

	// Writable: upgraded to the current format with the values in force.
	db = openSettings(t, fs, week, time.Minute, false)
	m = storedMeta(t, db)
	require.Equal(t, encoding.StoreFormat, m.Format)
	require.Equal(t, int64(week), m.Retention)
	require.Equal(t, int64(time.Minute), m.LeaseTTL)
	require.Equal(t, old.EpochWidth, m.EpochWidth)
	require.Equal(t, old.Secret, m.Secret)
	l2, r, err := db.Claim(bg, key("s", "id"), fp)
	require.NoError(t, err)
	require.Nil(t, l2)
	require.Equal(t, "done", string(r.Result))
	l3, _, err := db.Claim(bg, key("s", "other"), fp)
	require.NoError(t, err)
	require.Equal(t, providerKey, l3.ProviderKey()) // the same secret
	require.NoError(t, l3.Release(bg))
	require.NoError(t, db.Close())
	db = openSettings(t, fs, 0, 0, true)
	requireSettings(t, db, week, time.Minute)
	require.NoError(t, db.Close())
}
