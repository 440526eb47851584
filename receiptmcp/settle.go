package receiptmcp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts"
)

// fingerprintMark begins every fingerprint the middleware stores
// (Fingerprint), so that a key it claimed can be told from the store alone
// (Owns), by tools that settle claims by hand. It starts with a NUL byte,
// which no printable fingerprint does.
const fingerprintMark = "\x00receiptmcp\x00"

// Owns reports whether r, a record of the store (from DB.Lookup, DB.Scan or
// a reconcile.Reconciler), is of a key this middleware claimed: its
// fingerprint carries the middleware's mark (see Fingerprint). The retries
// of such a key are answered from the tool result stored in its receipt,
// so a claim of it settled by hand must store one (EncodeResult), or be
// forgotten; a result in another form would be answered with an internal
// error for the whole retention.
//
// Keys claimed by a receiptmcp that did not mark its fingerprints (before
// Owns existed) are not recognised; the middleware still matches their
// retries.
func Owns(r *receipts.Receipt) bool {
	return r != nil && bytes.HasPrefix(r.Fingerprint, []byte(fingerprintMark))
}

// ErrInvalidResult is returned by EncodeResult and SettleResult for a tool
// result that cannot be stored: nil, one that still needs input (the
// middleware stores none of those), or one whose encoding is over
// receipts.MaxResultSize. It matches receipts.ErrInvalidArgument.
var ErrInvalidResult = fmt.Errorf("%w: receiptmcp: tool result cannot be stored", receipts.ErrInvalidArgument)

// EncodeResult returns the stored form of a tool result: the bytes the
// middleware keeps as a receipt's Result and replays (its JSON). Use it to
// settle by hand a claim of a key the middleware guards (Owns), with a
// lease from receipts.DB.TakeOver or in a reconcile.Reconciler's Check, so
// that its retries get that result, as SettleResult does. Errors:
// ErrInvalidResult.
func EncodeResult(res *mcp.CallToolResult) ([]byte, error) {
	if res == nil {
		return nil, fmt.Errorf("%w: nil", ErrInvalidResult)
	}
	if res.NeedsInput() || res.InputRequests != nil {
		return nil, fmt.Errorf("%w: it still needs input", ErrInvalidResult)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidResult, err)
	}
	if len(b) > receipts.MaxResultSize {
		return nil, fmt.Errorf("%w: %d bytes (at most %d)", ErrInvalidResult, len(b), receipts.MaxResultSize)
	}
	return b, nil
}

// SettleResult settles l, a claim of a key the middleware guards (Owns)
// taken over by hand (receipts.DB.TakeOver), with the tool result its
// retries are to get, as the middleware stores it: a Failed receipt if
// res.IsError, else a Succeeded one. A result EncodeResult refuses is
// refused with ErrInvalidResult, writing nothing and leaving l held:
// Abandon or Forget it. Other errors are Lease.Commit's and Lease.Fail's.
func SettleResult(ctx context.Context, l *receipts.Lease, res *mcp.CallToolResult) (*receipts.Receipt, error) {
	b, err := EncodeResult(res)
	if err != nil {
		return nil, err
	}
	if res.IsError {
		return l.Fail(ctx, b)
	}
	return l.Commit(ctx, b)
}
