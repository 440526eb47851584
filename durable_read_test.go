package receipts_test

// Durable before visible, for the readers that do not take the key lock
// (Scan, Count, the admin handler's list). Pebble publishes a committed
// batch to iterators before its WAL fsync returns; these tests hold that
// fsync on a channel and check that no reader reports the write meanwhile,
// and that what the readers reported is exactly what a power loss at that
// moment leaves.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
)

// walSyncGate is an errorfs injector that holds the next WAL sync, once
// armed, until release is closed. The sync is held before it reaches the
// crashable FS, so a CrashClone taken meanwhile lacks the write.
type walSyncGate struct {
	armed   atomic.Bool
	blocked chan struct{} // closed when the armed sync is held
	release chan struct{}
}

func newWALSyncGate() *walSyncGate {
	return &walSyncGate{blocked: make(chan struct{}), release: make(chan struct{})}
}

func (g *walSyncGate) String() string { return "walSyncGate" }

func (g *walSyncGate) MaybeError(op errorfs.Op) error {
	switch op.Kind {
	case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
	default:
		return nil
	}
	if strings.HasSuffix(op.Path, ".log") && g.armed.CompareAndSwap(true, false) {
		close(g.blocked)
		<-g.release
	}
	return nil
}

// readerView is what one reader reported, reduced to what can be compared
// with the surviving store: the records ("scope/id state") or counts.
type readerView struct {
	name    string
	records []string
}

func scanView(ctx context.Context, db *receipts.DB) readerView {
	var recs []string
	for r, err := range db.Scan(ctx, receipts.Filter{}) {
		if err != nil {
			recs = append(recs, "error: "+err.Error())
			continue
		}
		recs = append(recs, fmt.Sprintf("%s/%s %s", r.Key.Scope, r.Key.ID, r.State))
	}
	slices.Sort(recs)
	return readerView{name: "Scan", records: recs}
}

func countView(db *receipts.DB) readerView {
	s, err := db.Count(context.Background())
	if err != nil {
		return readerView{name: "Count", records: []string{"error: " + err.Error()}}
	}
	return readerView{name: "Count", records: []string{fmt.Sprintf("pending %d succeeded %d failed %d", s.Pending, s.Succeeded, s.Failed)}}
}

func adminListView(db *receipts.DB) readerView {
	rec := httptest.NewRecorder()
	receiptadmin.Handler(db).ServeHTTP(rec, httptest.NewRequest("GET", "/admin/list", nil))
	var l receiptadmin.List
	if err := json.Unmarshal(rec.Body.Bytes(), &l); err != nil {
		return readerView{name: "admin list", records: []string{"error: " + err.Error()}}
	}
	var recs []string
	for _, a := range l.Receipts {
		recs = append(recs, fmt.Sprintf("%s/%s %s", a.Scope, a.ID, a.State))
	}
	for _, e := range l.Errors {
		recs = append(recs, "error: "+e)
	}
	slices.Sort(recs)
	return readerView{name: "admin list", records: recs}
}

// rawRecords is every record key and value the engine shows an iterator.
func rawRecords(t *testing.T, db *receipts.DB) string {
	t.Helper()
	it, err := pebblestore.DB(db).NewIter(&pebble.IterOptions{LowerBound: keys.RecordsStart, UpperBound: keys.RecordsEnd})
	require.NoError(t, err)
	defer it.Close()
	var b bytes.Buffer
	for valid := it.First(); valid; valid = it.Next() {
		fmt.Fprintf(&b, "%x=%x\n", it.Key(), it.Value())
	}
	require.NoError(t, it.Error())
	return b.String()
}

func TestReadersNeverReportUnsyncedWrites(t *testing.T) {
	fp := []byte("fp")
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, db *receipts.DB) func() error // returns the write to hold
	}{
		{"commit", func(t *testing.T, db *receipts.DB) func() error {
			l, _, err := db.Claim(bg, key("s", "new"), fp)
			require.NoError(t, err)
			return func() error { _, err := l.Commit(bg, []byte("done")); return err }
		}},
		{"claim", func(t *testing.T, db *receipts.DB) func() error {
			return func() error { _, _, err := db.Claim(bg, key("s", "new"), fp); return err }
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := vfs.NewCrashableMem()
			gate := newWALSyncGate()
			clock := receiptstest.NewClock(receiptstest.DefaultStart)
			open := func(fs vfs.FS) *receipts.DB {
				db, err := pebblestore.Open("db", &pebblestore.Options{
					Options: receipts.Options{
						Retention:  time.Hour,
						LeaseTTL:   30 * time.Second,
						GCInterval: -1,
						Now:        clock.Now,
					},
					Pebble: &pebble.Options{FS: fs},
				})
				require.NoError(t, err)
				return db
			}
			// survivors is what a power loss now leaves, as each reader sees it.
			survivors := func() map[string]readerView {
				db := open(mem.CrashClone(vfs.CrashCloneCfg{}))
				defer func() { require.NoError(t, db.Close()) }()
				return map[string]readerView{"Scan": scanView(bg, db), "Count": countView(db), "admin list": adminListView(db)}
			}

			db := open(errorfs.Wrap(mem, gate))
			defer func() { require.NoError(t, db.Close()) }()
			var releaseOnce sync.Once
			release := func() { releaseOnce.Do(func() { close(gate.release) }) }
			defer release() // before Close, which waits for the held write
			_, err := db.Do(bg, key("s", "old"), fp, func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("ok"), nil })
			require.NoError(t, err)
			write := tc.setup(t, db)
			before := rawRecords(t, db)

			gate.armed.Store(true)
			wrote := make(chan error, 1)
			go func() { wrote <- write() }()
			<-gate.blocked
			// The premise: the write is visible to iterators while its
			// sync is held.
			for deadline := time.Now().Add(10 * time.Second); rawRecords(t, db) == before; {
				require.True(t, time.Now().Before(deadline), "the held write never became visible")
				time.Sleep(time.Millisecond)
			}

			views := make(chan readerView, 3)
			go func() { views <- scanView(bg, db) }()
			go func() { views <- countView(db) }()
			go func() { views <- adminListView(db) }()
			// Readers that answer while the sync is held must report only
			// what survives a crash now. (On code that exposes the write,
			// they answer at once; here they wait for durability.)
			held := survivors()
			grace := time.After(500 * time.Millisecond)
			answered := 0
		wait:
			for answered < 3 {
				select {
				case v := <-views:
					answered++
					require.Equal(t, held[v.name].records, v.records, "%s reported a write that a crash takes away", v.name)
				case <-grace:
					break wait
				}
			}
			t.Logf("%d of 3 readers answered while the sync was held", answered)

			release()
			require.NoError(t, <-wrote)
			// Once synced, the write is reported, and it survives.
			done := survivors()
			for ; answered < 3; answered++ {
				v := <-views
				require.Equal(t, done[v.name].records, v.records, v.name)
			}
			for name, v := range map[string]readerView{"Scan": scanView(bg, db), "Count": countView(db), "admin list": adminListView(db)} {
				require.Equal(t, done[name].records, v.records, name)
			}
			require.NotEqual(t, held["Scan"].records, done["Scan"].records)
		})
	}
}
