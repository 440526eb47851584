package receiptadmin_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
)

// TestGoldenJSON: the handler answers byte for byte what
// receipts.AdminHandler answered before it moved to this package
// (testdata/*.json were written by that handler on this fixture), so that
// receiptctl --addr and other clients of a running service keep working.
// The one change since is an added field, "waiters" in the stats (a client
// that does not know it ignores it). The stats' replay_cache_bytes value
// (not its format) changed when the cache began to keep small receipts'
// bytes (counted there), and its replay_cache_hits value rose from 2 to 4
// when the get endpoint began to read the key's step journal as well (a
// second lookup, answered from the cache, which keeps no record with steps).
// Only the disk usage and the GC's duration, which vary, are masked.
func TestGoldenJSON(t *testing.T) {
	s := newTestStore(t, nil)
	goldenFixture(t, s.db, s.clock)
	checkGolden(t, s.db, true)
}

// TestGoldenJSONOnPostgreSQL: on the PostgreSQL engine the handler answers
// the same get and list bytes as on Pebble (the stats differ: no replay
// cache, another disk), so receiptctl --addr reads either alike.
func TestGoldenJSONOnPostgreSQL(t *testing.T) {
	db, clock := openPG(t)
	goldenFixture(t, db, clock)
	checkGolden(t, db, false)
}

// goldenFixture fills db with the records the golden files show, moving
// clock one second per step.
func goldenFixture(t *testing.T, db *receipts.DB, clock *receiptstest.Clock) {
	t.Helper()
	step := func() { clock.Advance(time.Second) }
	fp := []byte("fingerprint")
	ok := func(res []byte) func(context.Context, *receipts.Lease) ([]byte, error) {
		return func(context.Context, *receipts.Lease) ([]byte, error) { step(); return res, nil }
	}
	_, err := db.Do(bg, key("acct_1", "op-ok"), fp, ok([]byte("ok:1")))
	require.NoError(t, err)
	_, err = db.Do(bg, key("acct_1", "op-bin"), fp, ok([]byte{0, 1, 2, 0xff}))
	require.NoError(t, err)
	_, err = db.Do(bg, key("acct_1", "op-failed"), fp, func(context.Context, *receipts.Lease) ([]byte, error) {
		step()
		return []byte("card declined"), receipts.Permanent(errors.New("declined"))
	})
	require.ErrorIs(t, err, receipts.ErrFailed)
	_, err = db.Do(bg, key("acct_2", "op-lost"), fp, func(context.Context, *receipts.Lease) ([]byte, error) {
		step()
		return nil, errors.New("timeout: outcome unknown")
	})
	require.Error(t, err)
	_, _, err = db.Claim(bg, key("acct_2", "op-live"), fp)
	require.NoError(t, err)
	step()
	_, err = db.Do(bg, key("\xff\xfe", "id\x00"), fp, ok([]byte("odd key")))
	require.NoError(t, err)
	step()
}

// checkGolden requires the handler's answers on db to be the golden files.
// pebble: also the stats ones, and the list in Pebble's storage order (a
// length-prefixed scope first); on another engine the list may come in
// another order (its Scan's), so its receipts are compared as a set, each
// byte for byte.
func checkGolden(t *testing.T, db *receipts.DB, pebble bool) {
	t.Helper()
	h := receiptadmin.Handler(db)
	varying := regexp.MustCompile(`"(disk_bytes|duration)":("[^"]*"|\d+)`)
	norm := func(body string) string {
		body = varying.ReplaceAllString(body, `"$1":X`)
		const open, end = `"receipts":[`, "],\"errors\":"
		i, j := strings.Index(body, open), strings.LastIndex(body, end)
		if pebble || i < 0 || j < i {
			return body
		}
		elems := strings.Split(strings.TrimSuffix(body[i+len(open):j], "\n"), "\n,")
		slices.Sort(elems)
		return body[:i+len(open)] + strings.Join(elems, "\n,") + "\n" + body[j:]
	}
	check := func(name, target string) {
		t.Helper()
		want, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(t, err)
		rec := httptest.NewRecorder()
		req := httptest.NewRequest("GET", target, nil)
		req.RemoteAddr = "127.0.0.1:40000" // the handler answers loopback only by default
		h.ServeHTTP(rec, req)
		require.Equal(t, 200, rec.Code, name)
		require.Equal(t, norm(string(want)), norm(rec.Body.String()), name)
	}
	check("get.json", "/admin/receipts/get?scope=acct_1&id=op-ok")
	check("get-live.json", "/admin/receipts/get?scope=acct_2&id=op-live")
	check("get-odd.json", "/admin/receipts/get?"+url.Values{"scope": {"\xff\xfe"}, "id": {"id\x00"}}.Encode())
	check("list.json", "/admin/receipts/list")
	check("list-abandoned.json", "/admin/receipts/list?abandoned=true")
	if !pebble {
		return
	}
	check("stats-nogc.json", "/admin/receipts/stats")
	_, err := db.GC(bg)
	require.NoError(t, err)
	check("stats.json", "/admin/receipts/stats")
}
