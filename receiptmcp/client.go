package receiptmcp

import (
	"context"
	"maps"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts/internal/uuidv7"
)

type operationKeyCtx struct{}

// NewOperationKey returns a fresh operation key: a UUID version 7 (RFC
// 9562) in its canonical 36-character form, whose first 48 bits are the
// mint time in Unix milliseconds and whose other 74 bits are random. Mint
// one when a person approves an action, keep it with the approval, and
// send it with every attempt of that action. A store opened with
// receipts.Options{KeyTime: receipts.UUIDv7Time} answers a key minted more
// than Retention + TombstoneWindow ago with ErrExpired, without a lookup.
func NewOperationKey() string { return uuidv7.New(time.Now()) }

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
