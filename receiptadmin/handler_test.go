package receiptadmin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// TestMain stops the throwaway PostgreSQL cluster, if a test started one;
// goroutine leaks are checked per test (leakCheck), so the cluster's own
// helpers never count.
func TestMain(m *testing.M) { pgtest.Main(m) }

func leakCheck(t *testing.T) {
	t.Helper()
	opts := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opts) })
}

var bg = context.Background()

func key(scope, id string) receipts.Key { return receipts.Key{Scope: scope, ID: id} }

// testStore is a store with a fake clock: Pebble on an in-memory FS, or
// PostgreSQL (a fresh schema of the test server).
type testStore struct {
	db    *receipts.DB
	clock *receiptstest.Clock
}

// testOptions are the options of every test store, changed by mod.
func testOptions(clock *receiptstest.Clock, mod func(*receipts.Options)) receipts.Options {
	o := receipts.Options{
		Retention:  time.Hour,
		LeaseTTL:   30 * time.Second,
		EpochWidth: 15 * time.Minute,
		GCInterval: -1,
		Now:        clock.Now,
	}
	if mod != nil {
		mod(&o)
	}
	return o
}

// newTestStore opens a Pebble store on an in-memory FS.
func newTestStore(t *testing.T, mod func(*receipts.Options)) *testStore {
	t.Helper()
	leakCheck(t)
	s := &testStore{clock: receiptstest.NewClock(time.Time{})}
	o := testOptions(s.clock, mod)
	db, err := pebblestore.Open("db", &pebblestore.Options{Options: o, Pebble: &pebble.Options{FS: vfs.NewMem()}})
	require.NoError(t, err)
	s.db = db
	t.Cleanup(func() {
		if s.db != nil {
			require.NoError(t, s.db.Close())
		}
	})
	return s
}

// onEngines runs test on each engine: Pebble, and PostgreSQL (skipped, or
// with CI=true failed, without a server).
func onEngines(t *testing.T, test func(t *testing.T, open func(*testing.T, func(*receipts.Options)) *testStore)) {
	t.Run("pebble", func(t *testing.T) { test(t, newTestStore) })
	t.Run("postgresql", func(t *testing.T) { test(t, newPGTestStore) })
}

// adminFixture fills s with one record of each kind: two succeeded (one
// binary result), one failed, one live claim, one abandoned claim, and a
// key that is not valid UTF-8.
func adminFixture(t *testing.T, s *testStore) {
	t.Helper()
	ctx := context.Background()
	fp := []byte("fingerprint")
	ok := func(res []byte) func(context.Context, *receipts.Lease) ([]byte, error) {
		return func(context.Context, *receipts.Lease) ([]byte, error) { return res, nil }
	}
	_, err := s.db.Do(ctx, key("acct_1", "op-ok"), fp, ok([]byte("ok:1")))
	require.NoError(t, err)
	_, err = s.db.Do(ctx, key("acct_1", "op-bin"), fp, ok([]byte{0, 1, 2, 0xff}))
	require.NoError(t, err)
	_, err = s.db.Do(ctx, key("acct_1", "op-failed"), fp, func(context.Context, *receipts.Lease) ([]byte, error) {
		return []byte("card declined"), receipts.Permanent(errors.New("declined"))
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	_, err = s.db.Do(ctx, key("acct_2", "op-lost"), fp, func(context.Context, *receipts.Lease) ([]byte, error) {
		return nil, errors.New("timeout: outcome unknown")
	})
	require.Error(t, err)
	l, _, err := s.db.Claim(ctx, key("acct_2", "op-live"), fp)
	require.NoError(t, err)
	require.NotNil(t, l)
	_, err = s.db.Do(ctx, key("\xff\xfe", "id\x00"), fp, ok([]byte("odd key")))
	require.NoError(t, err)
}

// adminGet GETs target from h and decodes the JSON answer into v (if not
// nil); it returns the status.
func adminGet(t *testing.T, h http.Handler, method, target string, v any) int {
	t.Helper()
	req := httptest.NewRequest(method, target, nil)
	req.RemoteAddr = "127.0.0.1:40000" // the handler answers loopback only by default (auth_test.go)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"), target)
	if v != nil && method != http.MethodHead {
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), v), "%s: %s", target, rec.Body.String())
	}
	return rec.Code
}

type adminErr struct {
	Error string `json:"error"`
}

func TestHandlerGet(t *testing.T) {
	onEngines(t, func(t *testing.T, open func(*testing.T, func(*receipts.Options)) *testStore) {
		s := open(t, nil)
		adminFixture(t, s)
		h := receiptadmin.Handler(s.db)

		var r receiptadmin.Receipt
		require.Equal(t, http.StatusOK, adminGet(t, h, "GET", "/get?scope=acct_1&id=op-ok", &r))
		require.Equal(t, "succeeded", r.State)
		require.Equal(t, []byte("ok:1"), r.Result)
		require.Equal(t, uint32(1), r.Attempts)
		require.Equal(t, "66696e6765727072696e74", r.Fingerprint) // hex("fingerprint")
		require.Equal(t, key("acct_1", "op-ok"), r.Key())
		require.True(t, r.LeaseExpiresAt.IsZero())
		require.Equal(t, time.UTC, r.UpdatedAt.Location())

		var bin receiptadmin.Receipt
		require.Equal(t, http.StatusOK, adminGet(t, h, "GET", "/get?scope=acct_1&id=op-bin", &bin))
		require.Equal(t, []byte{0, 1, 2, 0xff}, bin.Result)

		var lost receiptadmin.Receipt
		require.Equal(t, http.StatusOK, adminGet(t, h, "GET", "/get?scope=acct_2&id=op-lost", &lost))
		require.Equal(t, "pending", lost.State)
		require.True(t, lost.Abandoned)
		require.Nil(t, lost.Result)

		var live receiptadmin.Receipt
		require.Equal(t, http.StatusOK, adminGet(t, h, "GET", "/get?scope=acct_2&id=op-live", &live))
		require.Equal(t, "pending", live.State)
		require.False(t, live.Abandoned)
		require.False(t, live.LeaseExpiresAt.IsZero())

		// A key that is not UTF-8 comes back exactly, through the base64 forms.
		var odd receiptadmin.Receipt
		q := url.Values{"scope": {"\xff\xfe"}, "id": {"id\x00"}}
		require.Equal(t, http.StatusOK, adminGet(t, h, "GET", "/get?"+q.Encode(), &odd))
		require.Equal(t, key("\xff\xfe", "id\x00"), odd.Key())
		require.Equal(t, []byte("\xff\xfe"), odd.ScopeBase64)
		require.Nil(t, odd.IDBase64) // "id\x00" is valid UTF-8

		var e adminErr
		require.Equal(t, http.StatusNotFound, adminGet(t, h, "GET", "/get?scope=acct_1&id=nope", &e))
		require.Contains(t, e.Error, "not found")
		require.Equal(t, http.StatusBadRequest, adminGet(t, h, "GET", "/get?scope=acct_1", &e))
		require.Contains(t, e.Error, "invalid key")
	})
}

func TestHandlerSkipsBeforeReplay(t *testing.T) {
	onEngines(t, func(t *testing.T, open func(*testing.T, func(*receipts.Options)) *testStore) {
		s := open(t, func(o *receipts.Options) {
			o.BeforeReplay = func(context.Context, *receipts.Receipt) error { return errors.New("forbidden") }
		})
		_, err := s.db.Do(bg, key("a", "b"), []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) {
			return []byte("x"), nil
		})
		require.NoError(t, err)
		_, err = s.db.Lookup(bg, key("a", "b"))
		require.ErrorContains(t, err, "forbidden")
		var r receiptadmin.Receipt
		require.Equal(t, http.StatusOK, adminGet(t, receiptadmin.Handler(s.db), "GET", "/get?scope=a&id=b", &r))
		require.Equal(t, []byte("x"), r.Result)
	})
}

func TestHandlerList(t *testing.T) {
	onEngines(t, func(t *testing.T, open func(*testing.T, func(*receipts.Options)) *testStore) {
		s := open(t, nil)
		adminFixture(t, s)
		h := receiptadmin.Handler(s.db)
		ids := func(target string) []string {
			t.Helper()
			var l receiptadmin.List
			require.Equal(t, http.StatusOK, adminGet(t, h, "GET", target, &l))
			require.Empty(t, l.Errors)
			require.False(t, l.Now.IsZero())
			var out []string
			for _, r := range l.Receipts {
				out = append(out, r.Key().ID)
			}
			return out
		}
		require.ElementsMatch(t, []string{"op-ok", "op-bin", "op-failed", "op-lost", "op-live", "id\x00"}, ids("/list"))
		require.ElementsMatch(t, []string{"op-ok", "op-bin", "op-failed"}, ids("/list?scope=acct_1"))
		require.ElementsMatch(t, []string{"op-lost", "op-live"}, ids("/list?state=pending"))
		require.ElementsMatch(t, []string{"op-lost"}, ids("/list?abandoned=true"))
		require.ElementsMatch(t, []string{"op-failed"}, ids("/list?scope=acct_1&state=failed"))
		require.Len(t, ids("/list?limit=2"), 2)
		require.Empty(t, ids("/list?scope=nobody"))

		// The lease of op-live runs out: it is abandoned too.
		s.clock.Advance(time.Minute)
		require.ElementsMatch(t, []string{"op-lost", "op-live"}, ids("/list?abandoned=1"))

		var e adminErr
		for _, bad := range []string{"state=done", "abandoned=maybe", "limit=x", "limit=-1", "scope=" + strings.Repeat("s", 256)} {
			require.Equal(t, http.StatusBadRequest, adminGet(t, h, "GET", "/list?"+bad, &e), bad)
			require.NotEmpty(t, e.Error)
		}
	})
}

func TestHandlerListCorrupt(t *testing.T) {
	s := newTestStore(t, nil)
	adminFixture(t, s)
	// Overwrite the first record's value with garbage.
	it, err := pebblestore.DB(s.db).NewIter(nil)
	require.NoError(t, err)
	var k []byte
	for valid := it.First(); valid; valid = it.Next() {
		if strings.HasPrefix(string(it.Key()), "\x00rcptr") {
			k = append([]byte(nil), it.Key()...)
			break
		}
	}
	require.NoError(t, it.Close())
	require.NotNil(t, k)
	require.NoError(t, pebblestore.DB(s.db).Set(k, []byte("garbage"), nil))

	var l receiptadmin.List
	require.Equal(t, http.StatusOK, adminGet(t, receiptadmin.Handler(s.db), "GET", "/list", &l))
	require.Len(t, l.Receipts, 5)
	require.Len(t, l.Errors, 1)
	require.Contains(t, l.Errors[0], "corrupt")
}

func TestHandlerStats(t *testing.T) {
	s := newTestStore(t, nil)
	adminFixture(t, s)
	_, err := s.db.GC(bg)
	require.NoError(t, err)
	var st receiptadmin.Stats
	require.Equal(t, http.StatusOK, adminGet(t, receiptadmin.Handler(s.db), "GET", "/admin/receipts/stats", &st))
	require.Equal(t, int64(2), st.Pending)
	require.Equal(t, int64(1), st.Abandoned)
	require.Equal(t, int64(3), st.Succeeded)
	require.Equal(t, int64(1), st.Failed)
	require.Equal(t, "1h0m0s", st.Retention)
	require.Equal(t, "30s", st.LeaseTTL)
	d, err := time.ParseDuration(st.EpochWidth)
	require.NoError(t, err)
	require.Equal(t, 15*time.Minute, d)
	require.Equal(t, 1, st.LiveEpochs)
	require.NotNil(t, st.LastGC)
	require.Equal(t, uint64(6), st.Counters.Claims)
	require.Equal(t, uint64(1), st.Counters.Abandons)
}

func TestHandlerErrors(t *testing.T) {
	onEngines(t, func(t *testing.T, open func(*testing.T, func(*receipts.Options)) *testStore) {
		s := open(t, nil)
		h := receiptadmin.Handler(s.db)
		var e adminErr
		require.Equal(t, http.StatusMethodNotAllowed, adminGet(t, h, "POST", "/list", &e))
		require.Equal(t, http.StatusNotFound, adminGet(t, h, "GET", "/delete", &e))
		require.Equal(t, http.StatusOK, adminGet(t, h, "HEAD", "/list", nil))

		// Mounted on a real server under a prefix, with no StripPrefix.
		mux := http.NewServeMux()
		mux.Handle("/admin/receipts/", h)
		srv := httptest.NewServer(mux)
		defer srv.Close()
		resp, err := srv.Client().Get(srv.URL + "/admin/receipts/list?state=succeeded")
		require.NoError(t, err)
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.JSONEq(t, `{"now":"`+s.clock.Now().UTC().Format(time.RFC3339Nano)+`","receipts":[],"errors":[]}`, string(body))
		srv.Client().CloseIdleConnections()

		require.NoError(t, s.db.Close())
		require.Equal(t, http.StatusServiceUnavailable, adminGet(t, h, "GET", "/list", &e))
		require.Equal(t, http.StatusServiceUnavailable, adminGet(t, h, "GET", "/stats", &e))
		require.Equal(t, http.StatusServiceUnavailable, adminGet(t, h, "GET", "/get?scope=a&id=b", &e))
		require.Contains(t, e.Error, "closed")
		s.db = nil
	})
}

// A service mounts the admin handler on its admin listener; receiptctl
// --addr (or any HTTP client) reads it.
func ExampleHandler() {
	db, err := pebblestore.Open("db", &pebblestore.Options{Pebble: &pebble.Options{FS: vfs.NewMem()}})
	if err != nil {
		panic(err)
	}
	defer db.Close()
	ctx := context.Background()
	_, _ = db.Do(ctx, receipts.Key{Scope: "acct_7", ID: "op-42"}, []byte("fp"),
		func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("charged"), nil })

	mux := http.NewServeMux()
	mux.Handle("/admin/receipts/", receiptadmin.Handler(db))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	// receiptctl --addr <srv.URL>/admin/receipts get acct_7 op-42
	resp, err := srv.Client().Get(srv.URL + "/admin/receipts/get?scope=acct_7&id=op-42")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	var r receiptadmin.Receipt
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		panic(err)
	}
	fmt.Println(r.Key(), r.State, string(r.Result))
	// Output: "acct_7"/"op-42" succeeded charged
}
