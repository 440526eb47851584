package receiptmcp

import (
	"context"
	"crypto/rand"
	"maps"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type operationKeyCtx struct{}

// NewOperationKey returns a fresh operation key: a UUID version 7 (RFC
// 9562) in its canonical 36-character form, whose first 48 bits are the
// mint time in Unix milliseconds and whose other 74 bits are random. Mint
// one when a person approves an action, keep it with the approval, and
// send it with every attempt of that action. A store opened with
// receipts.Options{KeyTime: receipts.UUIDv7Time} answers a key minted more
// than Retention + TombstoneWindow ago with ErrExpired, without a lookup.
func NewOperationKey() string { return newUUIDv7(time.Now()) }

// newUUIDv7 mints a UUIDv7 for the time t.
func newUUIDv7(t time.Time) string {
	var b [16]byte
	_, _ = rand.Read(b[6:]) // never fails (crypto/rand)
	ms := uint64(t.UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	b[6] = 0x70 | b[6]&0x0f // version 7
	b[8] = 0x80 | b[8]&0x3f // variant 10
	const digits = "0123456789abcdef"
	out := make([]byte, 0, 36)
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, digits[c>>4], digits[c&0xf])
	}
	return string(out)
}

// WithOperationKey returns a context that makes ClientMiddleware send key
// as the operation key of the tools/call requests made with it. Derive the
// context of every retry of one approved action from the same key.
func WithOperationKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, operationKeyCtx{}, key)
}

// OperationKeyFrom returns the key set by WithOperationKey.
func OperationKeyFrom(ctx context.Context) (key string, ok bool) {
	key, ok = ctx.Value(operationKeyCtx{}).(string)
	return key, ok && key != ""
}

// ClientMiddleware returns client sending middleware that copies the
// operation key of the call's context (WithOperationKey) into the
// tools/call request's params._meta[metaKey] ("" means DefaultMetaKey).
// A key already present in the params wins. The caller's params are not
// modified. Install it with client.AddSendingMiddleware.
//
// ClientMiddleware panics if metaKey is malformed or reserved (see
// Config.MetaKey).
func ClientMiddleware(metaKey string) mcp.Middleware {
	if metaKey == "" {
		metaKey = DefaultMetaKey
	}
	if err := validateMetaKey(metaKey); err != nil {
		panic("receiptmcp: ClientMiddleware: " + err.Error())
	}
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			key, ok := OperationKeyFrom(ctx)
			if !ok || method != methodCallTool {
				return next(ctx, method, req)
			}
			p, ok := req.GetParams().(*mcp.CallToolParams)
			cs, csOK := req.GetSession().(*mcp.ClientSession)
			if !ok || !csOK || p == nil {
				return next(ctx, method, req)
			}
			if _, set := p.Meta[metaKey]; set {
				return next(ctx, method, req)
			}
			params := *p
			params.Meta = maps.Clone(p.Meta)
			if params.Meta == nil {
				params.Meta = make(mcp.Meta, 1)
			}
			params.Meta[metaKey] = key
			return next(ctx, method, &mcp.ClientRequest[mcp.Params]{Session: cs, Params: &params})
		}
	}
}
