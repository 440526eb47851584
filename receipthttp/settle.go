package receipthttp

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net/http"

	"github.com/receiptstore/receipts"
)

// fingerprintMark begins every fingerprint the middleware stores, so that a
// key it claimed can be told from the store alone (Owns), by tools that
// settle claims by hand. It starts with a NUL byte, which no printable
// fingerprint does.
const fingerprintMark = "\x00receipthttp\x00"

// markFingerprint returns the fingerprint the middleware stores for fp, the
// digest of Config.Fingerprint: the mark, then fp, or, if the two would be
// longer than receipts.MaxFingerprintLen, the mark and fp's SHA-256.
func markFingerprint(fp []byte) []byte {
	out := make([]byte, 0, len(fingerprintMark)+max(len(fp), sha256.Size))
	out = append(out, fingerprintMark...)
	if len(fingerprintMark)+len(fp) > receipts.MaxFingerprintLen {
		sum := sha256.Sum256(fp)
		return append(out, sum[:]...)
	}
	return append(out, fp...)
}

// Owns reports whether r, a record of the store (from DB.Lookup, DB.Scan or
// a reconcile.Reconciler), is of a key this middleware claimed: its
// fingerprint carries the middleware's mark. The retries of such a key are
// answered from the response stored in its receipt, so a claim of it
// settled by hand must store one (EncodeResponse), or be forgotten; a result
// in another form would be answered with 500 for the whole retention.
//
// Keys claimed by a receipthttp that did not mark its fingerprints (before
// Owns existed) are not recognised; the middleware still matches their
// retries (see Config.Fingerprint).
func Owns(r *receipts.Receipt) bool {
	return r != nil && bytes.HasPrefix(r.Fingerprint, []byte(fingerprintMark))
}

// ErrInvalidResponse is returned by EncodeResponse and SettleResponse for a
// response that cannot be stored or settled: a status outside 200-599, a header name
// that is not a token, more than 64 header names or 16 values of one, or an
// encoding over receipts.MaxResultSize. It matches
// receipts.ErrInvalidArgument.
var ErrInvalidResponse = fmt.Errorf("%w: receipthttp: response cannot be stored", receipts.ErrInvalidArgument)

// EncodeResponse returns the stored form of an HTTP response: the bytes the
// middleware keeps as a receipt's Result and replays (status, every header
// in header, body). Use it to settle by hand a claim of a key the
// middleware guards (Owns), with a lease from receipts.DB.TakeOver or in a
// reconcile.Reconciler's Check, so that its retries get that response, as
// SettleResponse does. Errors: ErrInvalidResponse.
func EncodeResponse(status int, header http.Header, body []byte) ([]byte, error) {
	if status < 200 || status > 599 {
		return nil, fmt.Errorf("%w: status %d is not a final status (200-599)", ErrInvalidResponse, status)
	}
	if len(header) > maxStoredHeaders {
		return nil, fmt.Errorf("%w: %d header names (at most %d)", ErrInvalidResponse, len(header), maxStoredHeaders)
	}
	canon := make(http.Header, len(header))
	names := make([]string, 0, len(header))
	for name, vs := range header {
		if !validHeaderName(name) {
			return nil, fmt.Errorf("%w: header name %q", ErrInvalidResponse, name)
		}
		if len(vs) > maxHeaderValues {
			return nil, fmt.Errorf("%w: header %s has %d values (at most %d)", ErrInvalidResponse, name, len(vs), maxHeaderValues)
		}
		c := http.CanonicalHeaderKey(name)
		if _, dup := canon[c]; dup {
			return nil, fmt.Errorf("%w: header %s given twice", ErrInvalidResponse, c)
		}
		canon[c] = vs
		names = append(names, c)
	}
	out := encodeResponse(nil, status, canon, names, body)
	if len(out) > receipts.MaxResultSize {
		return nil, fmt.Errorf("%w: %d bytes stored (at most %d)", ErrInvalidResponse, len(out), receipts.MaxResultSize)
	}
	return out, nil
}

// SettleResponse settles l, a claim of a key the middleware guards (Owns)
// taken over by hand (receipts.DB.TakeOver), with the response its retries
// are to get, as the middleware stores it under DefaultPolicy: a 2xx or 3xx
// response as a Succeeded receipt, a 4xx as a Failed one. A 409 or 429 (the
// handler declined: forget the claim instead, Lease.Forget) and a 5xx (not
// an outcome) are refused with ErrInvalidResponse, as is a response
// EncodeResponse refuses. A refusal writes nothing and leaves l held:
// Abandon or Forget it. Other errors are Lease.Commit's and Lease.Fail's.
func SettleResponse(ctx context.Context, l *receipts.Lease, status int, header http.Header, body []byte) (*receipts.Receipt, error) {
	outcome := DefaultPolicy(status)
	switch {
	case status >= 200 && outcome == Release:
		return nil, fmt.Errorf("%w: status %d means the handler declined; forget the claim instead", ErrInvalidResponse, status)
	case status >= 200 && outcome == Abandon:
		return nil, fmt.Errorf("%w: status %d is not an outcome; the middleware stores none for it", ErrInvalidResponse, status)
	}
	res, err := EncodeResponse(status, header, body)
	if err != nil {
		return nil, err
	}
	if outcome == Fail {
		return l.Fail(ctx, res)
	}
	return l.Commit(ctx, res)
}
