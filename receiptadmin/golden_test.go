package receiptadmin_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/stretchr/testify/require"
)

// TestGoldenJSON: the handler answers byte for byte what
// receipts.AdminHandler answered before it moved to this package
// (testdata/*.json were written by that handler on this fixture), so that
// receiptctl --addr and other clients of a running service keep working.
// Only the disk usage and the GC's duration, which vary, are masked.
func TestGoldenJSON(t *testing.T) {
	s := newTestStore(t, nil)
	step := func() { s.clock.Advance(time.Second) }
	fp := []byte("fingerprint")
	ok := func(res []byte) func(context.Context, *receipts.Lease) ([]byte, error) {
		return func(context.Context, *receipts.Lease) ([]byte, error) { step(); return res, nil }
	}
	db := s.db
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

	h := receiptadmin.Handler(db)
	varying := regexp.MustCompile(`"(disk_bytes|duration)":("[^"]*"|\d+)`)
	check := func(name, target string) {
		t.Helper()
		want, err := os.ReadFile(filepath.Join("testdata", name))
		require.NoError(t, err)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", target, nil))
		require.Equal(t, 200, rec.Code, name)
		require.Equal(t, varying.ReplaceAllString(string(want), `"$1":X`), varying.ReplaceAllString(rec.Body.String(), `"$1":X`), name)
	}
	check("get.json", "/admin/receipts/get?scope=acct_1&id=op-ok")
	check("get-live.json", "/admin/receipts/get?scope=acct_2&id=op-live")
	check("get-odd.json", "/admin/receipts/get?"+url.Values{"scope": {"\xff\xfe"}, "id": {"id\x00"}}.Encode())
	check("list.json", "/admin/receipts/list")
	check("list-abandoned.json", "/admin/receipts/list?abandoned=true")
	check("stats-nogc.json", "/admin/receipts/stats")
	_, err = db.GC(bg)
	require.NoError(t, err)
	check("stats.json", "/admin/receipts/stats")
}
