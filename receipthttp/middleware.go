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
	"github.com/receiptstore/receipts/internal/stepwatch"
	"github.com/receiptstore/receipts/observe"
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
// (every third of its length: Config.LeaseFor, or the store's LeaseTTL),
// and db.Close waits for it and for its response to be
// recorded (receipts.Lease.Run).
func New(db *receipts.DB, cfg Config) (func(http.Handler) http.Handler, error) {
	if db == nil {
		return nil, errors.New("receipthttp: New needs a *receipts.DB")
	}
	c, err := cfg.resolve()
	if err != nil {
		return nil, err
	}
	if c.LeaseFor < 0 || (c.LeaseFor > 0 && c.LeaseFor >= db.Options().Retention) {
		return nil, fmt.Errorf("receipthttp: Config.LeaseFor %s must be positive (or zero) and less than the store's Retention %s", c.LeaseFor, db.Options().Retention)
	}
	m := &middleware{db: db, cfg: c}
	if c.LeaseFor > 0 {
		m.claimOpts = append(m.claimOpts, receipts.LeaseFor(c.LeaseFor))
	}
	if c.Wait > 0 {
		m.claimOpts = append(m.claimOpts, receipts.WaitAtMost(c.Wait))
	}
	return func(next http.Handler) http.Handler {
		if next == nil {
			panic("receipthttp: nil http.Handler")
		}
		return &handler{middleware: m, next: next}
	}, nil
}

// middleware is what the handlers made by one New share.
type middleware struct {
	db        *receipts.DB
	cfg       *config
	claimOpts []receipts.ClaimOption // Config.LeaseFor and Config.Wait
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
	if r.Pattern != "" && observe.OperationClass(r.Context()) == "" {
		// The route is the operation class, unless the application named
		// one (observe.WithOperationClass): the metrics label, and the
		// estimate behind Retry-After (receipts.InProgressError.RetryAfter).
		r = r.WithContext(observe.WithOperationClass(r.Context(), r.Pattern))
	}
	lease, rec, err := h.claim(r.Context(), key, fp)
	switch {
	case err != nil:
		p := claimProblem(c.Header, key, err)
		if p.Type == ProblemInternal {
			// Not the client's business (the error can name the store's
			// internals), so the operator's: it goes to the log.
			c.Logger.ErrorContext(r.Context(), "receipthttp: claiming the key failed", h.db.LogKey(key), "err", err)
		}
		h.problem(w, r, p)
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

// claim claims key, or returns its receipt, with a lease of Config.LeaseFor.
// It waits, Config.Wait at most, for a request in progress under the same
// key (receipts.WaitAtMost). The fingerprint stored is fp behind the
// middleware's mark (see Owns); a key claimed by a receipthttp that did not
// mark its fingerprints (its record holds fp itself) is claimed with fp.
func (h *handler) claim(ctx context.Context, key receipts.Key, fp []byte) (*receipts.Lease, *receipts.Receipt, error) {
	if len(fp) == 0 {
		return h.db.Claim(ctx, key, fp, h.claimOpts...) // refused: ErrInvalidFingerprint
	}
	l, rec, err := h.db.Claim(ctx, key, markFingerprint(fp), h.claimOpts...)
	if errors.Is(err, receipts.ErrIntentMismatch) {
		// One read, not a second claim: a mismatch is counted once. Inspect,
		// not Lookup: no Options.BeforeReplay for a key that is not replayed.
		if cur, lerr := h.db.Inspect(ctx, key); lerr == nil && bytes.Equal(cur.Fingerprint, fp) {
			return h.db.Claim(ctx, key, fp, h.claimOpts...)
		}
	}
	return l, rec, err
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
	case errors.Is(err, receipts.ErrErased):
		return &Problem{Type: ProblemKeyErased, Title: header + " erased", Status: http.StatusGone,
			Detail: "the data of this key's scope was erased; the request was not processed again", Err: err}
	case errors.Is(err, receipts.ErrExpired):
		return &Problem{Type: ProblemKeyExpired, Title: header + " expired", Status: http.StatusGone,
			Detail: "this key was used, and its stored response is no longer kept; the request was not processed again", Err: err}
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
			h.db.LogKey(rec.Key), "err", err)
		h.problem(w, r, &Problem{Type: ProblemInternal, Title: "Internal error",
			Status: http.StatusInternalServerError, Detail: "the stored response cannot be read", Err: err})
		return
	}
	hdr := w.Header()
	for name, vs := range resp.Header {
		hdr[name] = vs
	}
	hdr.Set(ReplayedHeader, "true")
	hdr.Set(RecordedAtHeader, rec.UpdatedAt.UTC().Format(http.TimeFormat))
	hdr.Set(ExpiresAtHeader, rec.ExpiresAt.UTC().Format(http.TimeFormat))
	w.WriteHeader(resp.Status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(resp.Body)
	}
}

// execute runs the handler under lease (receipts.Lease.Run, which
// renews the lease, keeps Close waiting and records the outcome) and settles
// the claim according to Config.Policy before the client sees the response.
func (h *handler) execute(w http.ResponseWriter, r *http.Request, lease *receipts.Lease) {
	a := &Attempt{Key: lease.Key(), Number: lease.Attempt(), Recovered: lease.Recovered(), Token: lease.Token(), ProviderKey: lease.ProviderKey(), lease: lease, steps: stepwatch.New(receipts.ErrStepMismatch, receipts.ErrOutcomeUnknown)}
	// From here on the effect may start: the client leaving must not cut the
	// handler short or keep the outcome from being recorded.
	ctx := context.WithValue(context.WithoutCancel(r.Context()), attemptKey{}, a)
	rw := newRecorder(w, h.cfg.MaxResponseBytes)
	var (
		ran      bool    // the handler returned
		outcome  Outcome // what Config.Policy said, for a stored response
		tooLarge int     // the stored response's size, if over MaxResultSize
	)
	_, err := lease.Run(ctx, func(ctx context.Context, _ *receipts.Lease) ([]byte, error) {
		h.next.ServeHTTP(rw, r.WithContext(ctx))
		ran = true
		if err := a.steps.Err("receipthttp"); err != nil {
			// A step's outcome is unknown, or a step did not match the
			// journal: whatever the handler wrote is not the outcome.
			return nil, err
		}
		if rw.mode != buffering {
			// Streamed, too large or hijacked: the client already has the
			// response (or the connection); nothing can be stored.
			return nil, errNotBuffered
		}
		status := rw.finalStatus()
		switch outcome = h.cfg.Policy(status); outcome {
		case Release:
			return nil, receipts.NotPerformed(fmt.Errorf("receipthttp: status %d released by Config.Policy", status))
		case Succeed, Fail:
		default:
			return nil, fmt.Errorf("receipthttp: status %d abandoned by Config.Policy", status)
		}
		hdr := rw.Header()
		if _, ok := hdr["Content-Type"]; !ok && rw.body.Len() > 0 {
			// Fix the type net/http would sniff, so a replay carries the same.
			hdr.Set("Content-Type", http.DetectContentType(rw.body.Bytes()))
		}
		result := encodeResponse(nil, status, hdr, h.cfg.StoredHeaders, rw.body.Bytes())
		if len(result) > receipts.MaxResultSize {
			tooLarge = len(result) // Run abandons the claim
		}
		if outcome == Fail { // stored without the staged effects
			return result, receipts.Permanent(fmt.Errorf("receipthttp: status %d stored as failed by Config.Policy", status))
		}
		return result, nil // committed with the staged effects
	})
	switch {
	case !ran: // Close began before the handler could start
		h.problem(w, r, claimProblem(h.cfg.Header, a.Key, err))
	case a.steps.Err("receipthttp") != nil && rw.mode == buffering:
		h.stepProblem(w, r, a, err)
	case (outcome == Succeed || outcome == Fail) && errors.Is(err, receipts.ErrOutcomeUnknown):
		if tooLarge > 0 {
			h.cfg.Logger.WarnContext(ctx, "receipthttp: response too large to store; claim abandoned",
				h.db.LogKey(a.Key), "bytes", tooLarge)
			rw.emit(r)
			return
		}
		h.cfg.Logger.ErrorContext(ctx, "receipthttp: recording the response failed; claim abandoned",
			h.db.LogKey(a.Key), "outcome", outcome, "err", err)
		clear(rw.Header())
		h.problem(w, r, &Problem{Type: ProblemNotRecorded, Title: "Outcome not recorded",
			Status: http.StatusServiceUnavailable, RetryAfter: 1,
			Detail: "the outcome of this request could not be recorded; retry with the same " + h.cfg.Header,
			Err:    err})
	default:
		// Stored, released or abandoned as Config.Policy said (a failure to
		// settle is logged by the store).
		rw.emit(r)
	}
}

// stepProblem answers a request whose step's outcome is unknown (503
// ProblemNotRecorded) or did not match the key's journal (500
// ProblemStepMismatch), in place of what the handler wrote; err is Run's.
func (h *handler) stepProblem(w http.ResponseWriter, r *http.Request, a *Attempt, err error) {
	name, mismatch := a.steps.Failed()
	clear(w.Header())
	if mismatch {
		h.cfg.Logger.ErrorContext(r.Context(), "receipthttp: a step does not match the key's journal; claim abandoned for an operator",
			h.db.LogKey(a.Key), "step", name, "err", err)
		h.problem(w, r, &Problem{Type: ProblemStepMismatch, Title: "Step mismatch", Status: http.StatusInternalServerError,
			Detail: fmt.Sprintf("step %q does not match the steps recorded for this %s (the service changed while the request was in flight); nothing was run, and an operator must settle it", name, h.cfg.Header),
			Step:   name, Err: err})
		return
	}
	h.cfg.Logger.WarnContext(r.Context(), "receipthttp: a step's outcome is unknown; claim abandoned",
		h.db.LogKey(a.Key), "step", name, "err", err)
	h.problem(w, r, &Problem{Type: ProblemNotRecorded, Title: "Outcome not recorded",
		Status: http.StatusServiceUnavailable, RetryAfter: 1,
		Detail: fmt.Sprintf("the outcome of step %q of this request is unknown; retry with the same %s: the retry resumes at that step", name, h.cfg.Header),
		Step:   name, Err: err})
}

// errNotBuffered abandons the claim of a response the client already has.
var errNotBuffered = errors.New("receipthttp: response streamed, too large or hijacked; not stored")

// problem writes p through the configured responder.
func (h *handler) problem(w http.ResponseWriter, r *http.Request, p *Problem) {
	h.cfg.ErrorResponder(w, r, p)
}
