package receiptadmin_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/stretchr/testify/require"
)

// serve sends GET target to h from remote (RemoteAddr) with the Authorization header auth
// (if not empty), and returns the status and the error the handler gave, if any.
func serve(h http.Handler, remote, target, auth string) (int, string, http.Header) {
	req := httptest.NewRequest(http.MethodGet, target, nil)
	req.RemoteAddr = remote
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	var e struct{ Error string }
	_ = json.Unmarshal(rec.Body.Bytes(), &e)
	return rec.Code, e.Error, rec.Header()
}

// Without Authorize the handler answers loopback only, and says why to everyone else; with
// it, the hook decides, from wherever the request comes.
func TestHandlerLoopbackOnly(t *testing.T) {
	s := newTestStore(t, nil)
	adminFixture(t, s)
	h := receiptadmin.Handler(s.db)
	for _, remote := range []string{"127.0.0.1:5000", "127.9.9.9:1", "[::1]:5000"} {
		code, msg, _ := serve(h, remote, "/get?scope=acct_1&id=op-ok", "")
		require.Equal(t, http.StatusOK, code, "%s: %s", remote, msg)
	}
	for _, remote := range []string{"10.0.0.5:5000", "192.0.2.1:1234", "[2001:db8::1]:443", "", "@"} {
		code, msg, _ := serve(h, remote, "/get?scope=acct_1&id=op-ok", "")
		require.Equal(t, http.StatusForbidden, code, remote)
		require.Contains(t, msg, "loopback only")
		require.Contains(t, msg, "receiptadmin.Authorize")
		code, _, _ = serve(h, remote, "/list", "")
		require.Equal(t, http.StatusForbidden, code, remote)
	}

	tok := receiptadmin.Handler(s.db, receiptadmin.Authorize(receiptadmin.BearerToken("s3cret-token")))
	for _, remote := range []string{"10.0.0.5:5000", "127.0.0.1:5000"} {
		code, msg, hdr := serve(tok, remote, "/stats", "")
		require.Equal(t, http.StatusUnauthorized, code, remote)
		require.Contains(t, msg, "no bearer token")
		require.Contains(t, hdr.Get("WWW-Authenticate"), "Bearer")
		code, _, _ = serve(tok, remote, "/stats", "Bearer wrong")
		require.Equal(t, http.StatusUnauthorized, code)
		code, msg, _ = serve(tok, remote, "/stats", "Bearer s3cret-token")
		require.Equal(t, http.StatusOK, code, msg)
	}
	empty := receiptadmin.Handler(s.db, receiptadmin.Authorize(receiptadmin.BearerToken("")))
	code, _, _ := serve(empty, "127.0.0.1:1", "/stats", "Bearer ")
	require.Equal(t, http.StatusUnauthorized, code, "an empty token lets nothing through")

	deny := receiptadmin.Handler(s.db, receiptadmin.Authorize(func(r *http.Request) error {
		if !strings.HasPrefix(r.Header.Get("X-Operator"), "ops-") {
			return errors.New("operators only")
		}
		return nil
	}))
	code, msg, _ := serve(deny, "127.0.0.1:1", "/stats", "")
	require.Equal(t, http.StatusForbidden, code)
	require.Equal(t, "operators only", msg)
}
