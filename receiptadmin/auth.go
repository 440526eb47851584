package receiptadmin

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
)

// Who may use the admin handler.
//
// The handler shows every scope's keys and results, without the application's
// authorization (Options.BeforeReplay): one mistake (mounting it on the service's public
// listener, or on 0.0.0.0) would show them to anyone who can reach the port. So a handler
// built without Authorize serves loopback only, and an application that serves it further
// says who may use it.

// ErrUnauthenticated is what an Authorize hook returns (wrapped) for a request without
// valid credentials: the handler answers 401 with a WWW-Authenticate challenge. Any other
// error of the hook is a 403.
var ErrUnauthenticated = errors.New("receiptadmin: unauthenticated")

// Option configures Handler.
type Option func(*handler)

// Authorize makes the handler ask fn about every request, from wherever it comes: nil lets
// it through; an error refuses it, with 401 if the error wraps ErrUnauthenticated, else 403,
// and the error's text. It replaces the default, loopback only. Put the service's operator
// authentication here (an mTLS client's identity, an SSO session), or BearerToken.
func Authorize(fn func(r *http.Request) error) Option {
	return func(h *handler) { h.authorize = fn }
}

// BearerToken is an Authorize hook that lets through the requests whose Authorization
// header is "Bearer " followed by token (compared in constant time), as `receiptctl --addr
// --token` (or RECEIPTCTL_TOKEN) sends it. An empty token lets nothing through.
func BearerToken(token string) func(r *http.Request) error {
	want := sha256.Sum256([]byte(token))
	return func(r *http.Request) error {
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			return fmt.Errorf("%w: no bearer token (send Authorization: Bearer TOKEN; receiptctl --token)", ErrUnauthenticated)
		}
		sum := sha256.Sum256([]byte(strings.TrimSpace(got)))
		if token == "" || subtle.ConstantTimeCompare(sum[:], want[:]) != 1 {
			return fmt.Errorf("%w: wrong bearer token", ErrUnauthenticated)
		}
		return nil
	}
}

// ErrNotLoopback is what Allowed answers (wrapped, with 403) for a request from off
// loopback when no Authorize hook was given.
var ErrNotLoopback = errors.New("receiptadmin: refused a request from off loopback")

// Allowed decides whether r may be served, as Handler decides it, so that other
// operator pages (package receiptconsole) share its rule: authorize's answer when it is
// not nil (0 and nil to serve; 401 and its error if the error wraps ErrUnauthenticated;
// 403 and its error otherwise), else loopback only (403 and an error wrapping
// ErrNotLoopback for any other address).
func Allowed(r *http.Request, authorize func(r *http.Request) error) (int, error) {
	if authorize != nil {
		err := authorize(r)
		switch {
		case err == nil:
			return 0, nil
		case errors.Is(err, ErrUnauthenticated):
			return http.StatusUnauthorized, err
		}
		return http.StatusForbidden, err
	}
	if loopback(r.RemoteAddr) {
		return 0, nil
	}
	return http.StatusForbidden, fmt.Errorf("%w %s", ErrNotLoopback, r.RemoteAddr)
}

// allowed decides whether r may be served: the Authorize hook's answer, or loopback only.
func (h *handler) allowed(r *http.Request) (int, error) {
	status, err := Allowed(r, h.authorize)
	if errors.Is(err, ErrNotLoopback) {
		return status, fmt.Errorf("receiptadmin: refused a request from %s: without receiptadmin.Authorize the admin handler answers loopback only (it shows every scope's keys and results); serve it to others with Authorize(receiptadmin.BearerToken(...)) or the service's own check: %w", r.RemoteAddr, ErrNotLoopback)
	}
	return status, err
}

// loopback reports whether addr (host:port, as http.Request.RemoteAddr) is a loopback
// address.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	ip := net.ParseIP(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	return ip != nil && ip.IsLoopback()
}
