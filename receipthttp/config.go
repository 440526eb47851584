package receipthttp

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/receiptstore/receipts"
)

// Defaults used by New for zero Config fields.
const (
	// DefaultHeader is the request header that carries the operation key.
	DefaultHeader = "Idempotency-Key"
	// DefaultMaxBodyBytes bounds the request body the middleware reads (1 MiB).
	DefaultMaxBodyBytes = 1 << 20
	// ReplayedHeader is set to "true" on every response served from a
	// receipt, as Stripe's API does.
	ReplayedHeader = "Idempotent-Replayed"
	// RecordedAtHeader, on every response served from a receipt, is when
	// the original response was recorded (the receipt's UpdatedAt), as an
	// HTTP-date (RFC 9110, like Last-Modified; whole seconds, rounded down).
	RecordedAtHeader = "Idempotency-Recorded-At"
	// ExpiresAtHeader, on every response served from a receipt, is until
	// when this response is replayed: until then every retry with this key
	// gets it (the receipt's ExpiresAt, the recording plus the store's
	// Retention), as an HTTP-date rounded down. After it, for the store's
	// TombstoneWindow, a request with the key gets 410 Gone (the key was
	// used; its receipt is gone), never a second execution; only after
	// that is it a new request. It answers the IETF httpapi idempotency
	// draft's question of how long a key is kept (issue #35).
	ExpiresAtHeader = "Idempotency-Expires-At"
)

// defaultMethods are the methods guarded when Config.Methods is nil.
var defaultMethods = []string{http.MethodPost, http.MethodPatch}

// defaultStoredHeaders are the response headers kept in a receipt when
// Config.StoredHeaders is nil.
var defaultStoredHeaders = []string{
	"Cache-Control", "Content-Language", "Content-Location", "Content-Type",
	"Etag", "Last-Modified", "Link", "Location",
}

// Outcome is what the middleware does with the claim once the handler has
// answered; Config.Policy picks it from the response status.
type Outcome uint8

const (
	// Succeed commits the response as a Succeeded receipt, together with any
	// effects the handler staged with Attempt.Stage (one synced batch).
	Succeed Outcome = iota + 1
	// Fail commits the response as a Failed receipt (a definitive failure,
	// replayed like a success). Staged effects are dropped.
	Fail
	// Release frees the key: the handler did nothing, and a retry runs it
	// again as a first attempt. Staged effects are dropped.
	Release
	// Abandon leaves the outcome unknown: nothing is stored, staged effects
	// are dropped, and the next retry (once the claim's lease has run out)
	// runs the handler as a recovered attempt (Attempt.Recovered).
	Abandon
)

// String returns "succeed", "fail", "release" or "abandon".
func (o Outcome) String() string {
	switch o {
	case Succeed:
		return "succeed"
	case Fail:
		return "fail"
	case Release:
		return "release"
	case Abandon:
		return "abandon"
	}
	return fmt.Sprintf("Outcome(%d)", uint8(o))
}

// DefaultPolicy is the storage policy used when Config.Policy is nil:
//
//   - 2xx, 3xx: Succeed (the response is the operation's result);
//   - 409 Conflict and 429 Too Many Requests: Release (the handler declined
//     to act; a retry may succeed);
//   - other 4xx: Fail (a definitive answer, replayed on retry);
//   - 5xx: Abandon (the effect may or may not have happened).
//
// A handler that panics is always treated as Abandon.
func DefaultPolicy(status int) Outcome {
	switch {
	case status == http.StatusConflict, status == http.StatusTooManyRequests:
		return Release
	case status >= 500:
		return Abandon
	case status >= 400:
		return Fail
	default:
		return Succeed
	}
}

// Config configures the middleware returned by New.
type Config struct {
	// Scope names the authenticated caller of r (account, tenant, agent
	// principal). Keys of different scopes never see each other. Required.
	// An error answers 401, or the error itself when it is a *Problem.
	Scope func(r *http.Request) (string, error)

	// Methods lists the guarded methods; others pass through untouched.
	// Default: POST and PATCH.
	Methods []string

	// Required makes the key mandatory on guarded methods: a request without
	// it gets 400. When false, such requests pass through without a receipt.
	Required bool

	// Header is the request header carrying the key. Default: Idempotency-Key.
	Header string

	// MaxBodyBytes bounds the request body, which the middleware reads in
	// full to fingerprint it; a larger body gets 413. Default: 1 MiB.
	MaxBodyBytes int64

	// MaxResponseBytes bounds the response body kept in a receipt. A handler
	// that writes more is passed through to the client and its claim is
	// abandoned, as for a streamed response. Default and maximum: what fits
	// in receipts.MaxResultSize.
	MaxResponseBytes int

	// Fingerprint digests the request's intent. A retry whose fingerprint
	// differs from the first request's gets 422. Default: SHA-256 over the
	// method, the URL path and the body (see DefaultFingerprint). The
	// middleware stores it behind a mark of its own (or, if the two would
	// be longer than receipts.MaxFingerprintLen, its SHA-256), so that
	// tools that settle claims by hand can tell its keys (Owns); a retry of
	// a key stored without the mark, by an older receipthttp, is matched
	// against the digest itself.
	Fingerprint func(r *http.Request, body []byte) ([]byte, error)

	// StoredHeaders lists the response headers kept in the receipt and sent
	// on replay. The first response carries every header the handler set.
	// Default: Cache-Control, Content-Language, Content-Location,
	// Content-Type, ETag, Last-Modified, Link, Location.
	StoredHeaders []string

	// Policy maps the handler's status to what is done with the claim.
	// Default: DefaultPolicy.
	Policy func(status int) Outcome

	// Wait, when positive, makes a duplicate of a request still in progress
	// wait up to Wait for the first one's response (then replayed) instead
	// of getting 409 at once. If the first one has not finished by then, the
	// duplicate gets 409 with Retry-After.
	Wait time.Duration

	// LeaseFor is the lease length of each request's claim
	// (receipts.LeaseFor), renewed every third of it while the handler
	// runs; zero means the store's Options.LeaseTTL. Set it for handlers
	// that take much longer (or less) than that. It must be less than the
	// store's Retention: New checks.
	LeaseFor time.Duration

	// ErrorResponder writes the responses the middleware makes itself
	// (400, 401, 409, 413, 422, 5xx). Default: WriteProblem.
	ErrorResponder func(w http.ResponseWriter, r *http.Request, p *Problem)

	// Logger receives failures that cannot be reported to the client
	// (a commit that failed after the handler ran). Default: slog.Default().
	Logger *slog.Logger
}

// DefaultFingerprint is the fingerprint used when Config.Fingerprint is nil:
// SHA-256 over a version tag, the method, the URL path and the body, each
// length-prefixed. Query strings and headers are not part of it; supply a
// Config.Fingerprint to include them.
func DefaultFingerprint(r *http.Request, body []byte) ([]byte, error) {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	for _, part := range [][]byte{[]byte("receipthttp/v1"), []byte(r.Method), []byte(r.URL.Path), body} {
		h.Write(n[:binary.PutUvarint(n[:], uint64(len(part)))])
		h.Write(part)
	}
	return h.Sum(nil), nil
}

// config is a validated Config with defaults filled in.
type config struct {
	Config
	methods map[string]bool
}

// errNoScope is returned by New when Config.Scope is nil.
var errNoScope = errors.New("receipthttp: Config.Scope is required (the authenticated caller that owns the keys)")

func (c Config) resolve() (*config, error) {
	if c.Scope == nil {
		return nil, errNoScope
	}
	if c.Header == "" {
		c.Header = DefaultHeader
	}
	if !validHeaderName(c.Header) {
		return nil, fmt.Errorf("receipthttp: Config.Header %q is not a valid header name", c.Header)
	}
	c.Header = http.CanonicalHeaderKey(c.Header)
	switch {
	case c.MaxBodyBytes == 0:
		c.MaxBodyBytes = DefaultMaxBodyBytes
	case c.MaxBodyBytes < 0:
		return nil, fmt.Errorf("receipthttp: Config.MaxBodyBytes %d is negative", c.MaxBodyBytes)
	}
	if c.MaxResponseBytes < 0 {
		return nil, fmt.Errorf("receipthttp: Config.MaxResponseBytes %d is negative", c.MaxResponseBytes)
	}
	if c.MaxResponseBytes == 0 || c.MaxResponseBytes > receipts.MaxResultSize {
		c.MaxResponseBytes = receipts.MaxResultSize
	}
	if c.Wait < 0 {
		return nil, fmt.Errorf("receipthttp: Config.Wait %v is negative", c.Wait)
	}
	if c.Fingerprint == nil {
		c.Fingerprint = DefaultFingerprint
	}
	if c.StoredHeaders == nil {
		c.StoredHeaders = defaultStoredHeaders
	}
	stored := make([]string, 0, len(c.StoredHeaders))
	for _, name := range c.StoredHeaders {
		if !validHeaderName(name) {
			return nil, fmt.Errorf("receipthttp: Config.StoredHeaders: %q is not a valid header name", name)
		}
		stored = append(stored, http.CanonicalHeaderKey(name))
	}
	if len(stored) > maxStoredHeaders {
		return nil, fmt.Errorf("receipthttp: Config.StoredHeaders lists %d headers, at most %d", len(stored), maxStoredHeaders)
	}
	c.StoredHeaders = stored
	if c.Policy == nil {
		c.Policy = DefaultPolicy
	}
	if c.ErrorResponder == nil {
		c.ErrorResponder = WriteProblem
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Methods == nil {
		c.Methods = defaultMethods
	}
	methods := make(map[string]bool, len(c.Methods))
	for _, m := range c.Methods {
		if m == "" {
			return nil, errors.New("receipthttp: Config.Methods contains an empty method")
		}
		methods[m] = true
	}
	return &config{Config: c, methods: methods}, nil
}
