package receiptmcp

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ParamsKeyMetaKey is the params._meta entry that carries a key a client
// sent as params.idempotencyKey, the field of MCP's closed idempotency
// proposal (SEP-3182), once AcceptIdempotencyKeyParam or
// AcceptIdempotencyKeyParamTransport has moved it there.
//
// The Go SDK decodes tools/call params into mcp.CallToolParamsRaw, which
// has no field for idempotencyKey, before any middleware runs: receiving
// middleware never sees it. So the field is moved into _meta on the raw
// message, by one of those two wrappers, and the middleware reads it
// there. A call that carries a key in both places with different values
// is rejected (invalid params, data.type "idempotency_key_invalid"); with
// the same value (as decoded: "k-1" and "k-\u0031" are one) it is one key.
// A client may also set this _meta entry itself.
const ParamsKeyMetaKey = "dev.receipts/idempotencyKey"

// maxAliasBody bounds the request bodies AcceptIdempotencyKeyParam reads;
// a larger body passes through untouched (the SDK refuses bodies larger
// than its own limit, mcp.DefaultMaxRequestBodyBytes, anyway).
const maxAliasBody = 10 << 20

// AcceptIdempotencyKeyParam wraps a streamable HTTP handler
// (mcp.NewStreamableHTTPHandler) so that a tools/call's
// params.idempotencyKey (SEP-3182) reaches the middleware, in
// params._meta[ParamsKeyMetaKey]. Other requests pass through untouched.
//
//	http.Handle("/mcp", receiptmcp.AcceptIdempotencyKeyParam(
//		mcp.NewStreamableHTTPHandler(getServer, nil)))
func AcceptIdempotencyKeyParam(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Body == nil || r.ContentLength > maxAliasBody {
			h.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, maxAliasBody+1))
		if err != nil || len(body) > maxAliasBody {
			r.Body = io.NopCloser(io.MultiReader(bytes.NewReader(body), r.Body))
			h.ServeHTTP(w, r)
			return
		}
		if msg, err := jsonrpc.DecodeMessage(body); err == nil {
			if req, ok := msg.(*jsonrpc.Request); ok && moveParamsKey(req) {
				if b, err := jsonrpc.EncodeMessage(req); err == nil {
					body = b
				}
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		h.ServeHTTP(w, r)
	})
}

// AcceptIdempotencyKeyParamTransport wraps a server transport that the
// application connects itself (mcp.StdioTransport, mcp.IOTransport) so that
// a tools/call's params.idempotencyKey (SEP-3182) reaches the middleware,
// in params._meta[ParamsKeyMetaKey]:
//
//	server.Run(ctx, receiptmcp.AcceptIdempotencyKeyParamTransport(&mcp.StdioTransport{}))
//
// For streamable HTTP, wrap the handler with AcceptIdempotencyKeyParam
// instead.
func AcceptIdempotencyKeyParamTransport(t mcp.Transport) mcp.Transport {
	return aliasTransport{t}
}

type aliasTransport struct{ mcp.Transport }

func (t aliasTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return aliasConn{c}, nil
}

type aliasConn struct{ mcp.Connection }

func (c aliasConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	msg, err := c.Connection.Read(ctx)
	if req, ok := msg.(*jsonrpc.Request); ok && err == nil {
		moveParamsKey(req)
	}
	return msg, err
}

// moveParamsKey moves a tools/call's params.idempotencyKey into
// params._meta[ParamsKeyMetaKey], and reports whether it changed req. An
// entry already there with the same value, compared as decoded JSON (so
// "k-1" and "k-\u0031" are one key), stays one key; with another value it
// is replaced by both values (an array, the entry's first), which the
// middleware refuses as two different keys (aliasKey).
func moveParamsKey(req *jsonrpc.Request) bool {
	if req.Method != methodCallTool || len(req.Params) == 0 || !bytes.Contains(req.Params, []byte(`"idempotencyKey"`)) {
		return false
	}
	var params map[string]json.RawMessage
	if json.Unmarshal(req.Params, &params) != nil {
		return false
	}
	key, ok := params["idempotencyKey"]
	if !ok {
		return false
	}
	delete(params, "idempotencyKey")
	var meta map[string]json.RawMessage
	if m, ok := params["_meta"]; ok && json.Unmarshal(m, &meta) != nil {
		return false // not an object: the SDK refuses it
	}
	if meta == nil {
		meta = map[string]json.RawMessage{}
	}
	if old, ok := meta[ParamsKeyMetaKey]; ok && !sameJSON(old, key) {
		key, _ = json.Marshal([]json.RawMessage{old, key})
	}
	meta[ParamsKeyMetaKey] = key
	m, err := json.Marshal(meta)
	if err != nil {
		return false
	}
	params["_meta"] = m
	p, err := json.Marshal(params)
	if err != nil {
		return false
	}
	req.Params = p
	return true
}

// sameJSON reports whether a and b are the same JSON value once decoded:
// one string escaped two ways is one string.
func sameJSON(a, b json.RawMessage) bool {
	if bytes.Equal(a, b) {
		return true
	}
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xs, ok1 := x.(string)
	ys, ok2 := y.(string)
	return ok1 && ok2 && xs == ys
}
