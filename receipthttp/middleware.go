package receipthttp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/receiptstore/receipts"
)

// New returns middleware that makes each request carrying an
// Idempotency-Key happen once per key and scope, with the response stored
// as a receipt in db and replayed to every retry. See the package
// documentation for the outcomes.
//
// New returns an error, rather than panicking later, for a nil db or an
// invalid Config (Config.Scope is required): a service that cannot tell its
// callers apart must not start, and a constructor error is what Go programs
// check at startup.
//
// While a handler runs, its claim's lease is renewed in the background
// (Lease.KeepAlive, every LeaseTTL/3).
func New(db *receipts.DB, cfg Config) (func(http.Handler) http.Handler, error) {
	if db == nil {
		return nil, errors.New("receipthttp: New needs a *receipts.DB")
	}
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	m := &middleware{db: db, cfg: c}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("receipthttp: nil http.Handler")
		}
		return &handler{middleware: m, next: next}
	}, nil
}

// middleware is what the handlers made by one New share.
type middleware struct {
	db  *receipts.DB
	cfg *config
}

type handler struct {
	*middleware
	next http.Handler
}

// ServeHTTP implements http.Handler.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c := h.cfg
	if !c.methods[r.Method] {
		h.next.ServeHTTP(w, r)
		return
	}
	id, present, err := parseKey(r.Header.Values(c.Header))
	switch {
	case err != nil:
		h.problem(w, r, &Problem{Type: ProblemKeyInvalid, Title: "Invalid " + c.Header + " header",
			Status: http.StatusBadRequest, Detail: err.Error(), Err: err})
		return
	case !present && c.Required:
		h.problem(w, r, &Problem{Type: ProblemKeyMissing, Title: "Missing " + c.Header + " header",
			Status: http.StatusBadRequest, Detail: "this operation requires an " + c.Header + " header"})
		return
	case !present:
		h.next.ServeHTTP(w, r)
		return
	}

	scope, err := c.Scope(r)
	if err == nil && scope == "" {
		err = errors.New("no scope for this request")
	}
	if err != nil {
		var p *Problem
		if !errors.As(err, &p) {
			p = &Problem{Type: ProblemUnauthorized, Title: "Unauthorized", Status: http.StatusUnauthorized, Err: err}
		}
		h.problem(w, r, p)
		return
	}

	body, p := h.readBody(w, r)
	if p != nil {
		h.problem(w, r, p)
		return
	}
	fp, err := c.Fingerprint(r, body)
	if err != nil {
		h.problem(w, r, &Problem{Type: ProblemBadRequest, Title: "Bad request", Status: http.StatusBadRequest,
			Detail: err.Error(), Err: err})
		return
	}

	key := receipts.Key{Scope: scope, ID: id}
	lease, rec, err := h.claim(r.Context(), key, fp)
	switch {
	case err != nil:
		h.problem(w, r, claimProblem(c.Header, key, err))
	case rec != nil:
		h.replay(w, r, rec)
	default:
		r2 := r.Clone(r.Context()) // execute replaces the context
		r2.Body = io.NopCloser(bytes.NewReader(body))
		r2.ContentLength = int64(len(body))
		r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		h.execute(w, r2, lease)
	}
}

// readBody reads the whole request body, bounded by MaxBodyBytes.
func (h *handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *Problem) {
	limit := h.cfg.MaxBodyBytes
	tooLarge := &Problem{Type: ProblemBodyTooLarge, Title: "Request body too large",
		Status: http.StatusRequestEntityTooLarge, Detail: fmt.Sprintf("the body is limited to %d bytes", limit)}
	if r.ContentLength > limit {
		return nil, tooLarge
	}
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge
		}
		return nil, &Problem{Type: ProblemBadRequest, Title: "Bad request", Status: http.StatusBadRequest,
			Detail: "reading the request body failed", Err: err}
	}
	return body, nil
}

// claim claims key, or returns its receipt. It waits, Config.Wait at most,
// for a request in progress under the same key (receipts.WaitAtMost).
func (h *handler) claim(ctx context.Context, key receipts.Key, fp []byte) (*receipts.Lease, *receipts.Receipt, error) {
	if h.cfg.Wait <= 0 {
		return h.db.Claim(ctx, key, fp)
	}
	return h.db.Claim(ctx, key, fp, receipts.WaitAtMost(h.cfg.Wait))
}

// claimProblem maps an error from Claim to the response the client gets.
func claimProblem(header string, key receipts.Key, err error) *Problem {
	var inProgress *receipts.InProgressError
	var p *Problem
	switch {
	case errors.As(err, &p): // from Options.BeforeReplay, for one
		return p
	case errors.As(err, &inProgress):
		return &Problem{Type: ProblemInProgress, Title: "Request in progress", Status: http.StatusConflict,
			Detail:     "a request with this " + header + " is still being processed; retry later",
			RetryAfter: retryAfterSeconds(inProgress.RetryAfter), Err: err}
	case errors.Is(err, receipts.ErrIntentMismatch):
		return &Problem{Type: ProblemKeyReused, Title: header + " reused with a different request",
			Status: http.StatusUnprocessableEntity,
			Detail: "this key was used for a request with another method, path or body", Err: err}
	case errors.Is(err, receipts.ErrInvalidKey) && !errors.Is(err, receipts.ErrInvalidFingerprint) && validKeyPart(key.Scope):
		return &Problem{Type: ProblemKeyInvalid, Title: "Invalid " + header + " header",
			Status: http.StatusBadRequest, Err: err}
	case errors.Is(err, receipts.ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &Problem{Type: ProblemUnavailable, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
			RetryAfter: 1, Err: err}
	default:
		return &Problem{Type: ProblemInternal, Title: "Internal error", Status: http.StatusInternalServerError, Err: err}
	}
}

func validKeyPart(s string) bool { return s != "" && len(s) <= receipts.MaxKeyPartLen }

// retryAfterSeconds rounds d up to whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) int {
	s := math.Ceil(d.Seconds())
	switch {
	case s < 1:
		return 1
	case s > 86400:
		return 86400
	}
	return int(s)
}

// replay answers r from a stored response.
func (h *handler) replay(w http.ResponseWriter, r *http.Request, rec *receipts.Receipt) {
	resp, err := decodeResponse(rec.Result)
	if err != nil {
		h.cfg.Logger.ErrorContext(r.Context(), "receipthttp: cannot replay stored response",
			"scope", rec.Key.Scope, "key", rec.Key.ID, "err", err)
		h.problem(w, r, &Problem{Type: ProblemInternal, Title: "Internal error",
			Status: http.StatusInternalServerError, Detail: "the stored response cannot be read", Err: err})
		return
	}
	hdr := w.Header()
	for name, vs := range resp.Header {
		hdr[name] = vs
	}
	hdr.Set(ReplayedHeader, "true")
	w.WriteHeader(resp.Status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(resp.Body)
	}
}

// execute runs the handler under lease and settles the claim according to
// Config.Policy before the client sees the response.
func (h *handler) execute(w http.ResponseWriter, r *http.Request, lease *receipts.Lease) {
	a := &Attempt{Key: lease.Key(), Number: lease.Attempt(), Recovered: lease.Recovered(), ProviderKey: lease.ProviderKey(), fx: new(effects)}
	// From here on the effect may start: the client leaving must not cut the
	// handler short or keep the outcome from being recorded.
	detached := context.WithoutCancel(r.Context())
	ctx, cancel := context.WithCancelCause(context.WithValue(detached, attemptKey{}, a))
	defer cancel(nil)

	rw := newRecorder(w, h.cfg.MaxResponseBytes)
	stopRenew := lease.KeepAlive(cancel)
	finished := false
	defer func() {
		if !finished { // the handler panicked (or called runtime.Goexit)
			stopRenew()
			h.abandon(detached, lease)
		}
	}()
	h.next.ServeHTTP(rw, r.WithContext(ctx))
	finished = true
	stopRenew()

	if rw.mode != buffering {
		// Streamed, too large or hijacked: the client already has the
		// response (or the connection); nothing can be stored.
		h.abandon(detached, lease)
		return
	}
	status := rw.finalStatus()
	outcome := h.cfg.Policy(status)
	if outcome == Succeed || outcome == Fail {
		hdr := rw.Header()
		if _, ok := hdr["Content-Type"]; !ok && rw.body.Len() > 0 {
			// Fix the type net/http would sniff, so a replay carries the same.
			hdr.Set("Content-Type", http.DetectContentType(rw.body.Bytes()))
		}
		result := encodeResponse(nil, status, hdr, h.cfg.StoredHeaders, rw.body.Bytes())
		if len(result) > receipts.MaxResultSize {
			h.cfg.Logger.WarnContext(ctx, "receipthttp: response too large to store; claim abandoned",
				"scope", a.Key.Scope, "key", a.Key.ID, "bytes", len(result))
			h.abandon(detached, lease)
			rw.emit(r)
			return
		}
		var err error
		switch effects := a.takeEffects(); {
		case outcome == Fail:
			_, err = lease.Fail(detached, result)
		case effects != nil:
			_, err = lease.CommitWith(detached, result, effects)
		default:
			_, err = lease.Commit(detached, result)
		}
		if err != nil {
			h.cfg.Logger.ErrorContext(ctx, "receipthttp: recording the response failed",
				"scope", a.Key.Scope, "key", a.Key.ID, "outcome", outcome, "err", err)
			clear(hdr)
			h.problem(w, r, &Problem{Type: ProblemNotRecorded, Title: "Outcome not recorded",
				Status: http.StatusServiceUnavailable, RetryAfter: 1,
				Detail: "the outcome of this request could not be recorded; retry with the same " + h.cfg.Header,
				Err:    err})
			return
		}
		rw.emit(r)
		return
	}
	if outcome == Release {
		if err := lease.Release(detached); err != nil && !errors.Is(err, receipts.ErrLeaseLost) {
			h.cfg.Logger.WarnContext(ctx, "receipthttp: releasing the claim failed",
				"scope", a.Key.Scope, "key", a.Key.ID, "err", err)
		}
	} else {
		h.abandon(detached, lease)
	}
	rw.emit(r)
}

// abandon leaves the claim's outcome unknown: the lease ends at once and
// the next attempt is a recovered one.
func (h *handler) abandon(ctx context.Context, lease *receipts.Lease) {
	if err := lease.Abandon(ctx); err != nil && !errors.Is(err, receipts.ErrLeaseLost) {
		h.cfg.Logger.WarnContext(ctx, "receipthttp: abandoning the claim failed",
			"scope", lease.Key().Scope, "key", lease.Key().ID, "err", err)
	}
}

// problem writes p through the configured responder.
func (h *handler) problem(w http.ResponseWriter, r *http.Request, p *Problem) {
	h.cfg.ErrorResponder(w, r, p)
}
