package receiptmcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/stepwatch"
	"github.com/receiptstore/receipts/observe"
)

const methodCallTool = "tools/call"

// Middleware returns server receiving middleware that runs each tools/call
// carrying an operation key once per key and scope, stores its result as a
// receipt in db and replays it to every retry. Install it with
// server.AddReceivingMiddleware. Every other method passes through. See the
// package documentation for the outcomes.
//
// Middleware panics if db is nil or cfg is invalid (a malformed or reserved
// MetaKey, an unknown Policy, a LeaseFor out of bounds): those are
// programming errors, found when the server is built.
func Middleware(db *receipts.DB, cfg Config) mcp.Middleware {
	if db == nil {
		panic("receiptmcp: Middleware needs a *receipts.DB")
	}
	c, err := cfg.resolve()
	if err != nil {
		panic(err)
	}
	if c.LeaseFor < 0 || (c.LeaseFor > 0 && c.LeaseFor >= db.Options().Retention) {
		panic(fmt.Sprintf("receiptmcp: Config.LeaseFor %s must be positive (or zero) and less than the store's Retention %s", c.LeaseFor, db.Options().Retention))
	}
	m := &middleware{db: db, cfg: c}
	if c.LeaseFor > 0 {
		m.claimOpts = append(m.claimOpts, receipts.LeaseFor(c.LeaseFor))
	}
	if c.wait > 0 {
		m.claimOpts = append(m.claimOpts, receipts.WaitAtMost(c.wait))
	}
	return func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if method != methodCallTool {
				return next(ctx, method, req)
			}
			call, ok := req.(*mcp.CallToolRequest)
			if !ok || call.Params == nil {
				return next(ctx, method, req)
			}
			return m.callTool(ctx, next, call)
		}
	}
}

// middleware is what the handlers made by one Middleware share.
type middleware struct {
	db        *receipts.DB
	cfg       *config
	claimOpts []receipts.ClaimOption // Config.LeaseFor and Config.Wait
}

func (m *middleware) callTool(ctx context.Context, next mcp.MethodHandler, req *mcp.CallToolRequest) (mcp.Result, error) {
	c := m.cfg
	tool := req.Params.Name
	policy := c.policy(tool)
	if policy == Skip {
		return next(ctx, methodCallTool, req)
	}
	id, present, err := operationKey(req.Params.Meta, c.MetaKey)
	alias, aliased, aerr := aliasKey(req.Params.Meta)
	switch {
	case err != nil:
		return nil, errKeyInvalid(c, tool, err.Error())
	case aerr != nil:
		return nil, errKeyInvalidAt(tool, ParamsKeyMetaKey, aerr.Error())
	case present && aliased && id != alias:
		return nil, errKeyInvalid(c, tool, "it differs from params.idempotencyKey (params._meta["+strconv.Quote(ParamsKeyMetaKey)+"])")
	case !present && aliased:
		id, present = alias, true
	}
	switch {
	case !present && policy == Required:
		return nil, errKeyMissing(c, tool)
	case !present:
		return next(ctx, methodCallTool, req)
	}

	scope, err := m.scope(ctx, req)
	if err == nil && scope == "" {
		err = errors.New("empty scope")
	}
	if err != nil {
		return nil, newError(CodeUnauthenticated,
			fmt.Sprintf("no authenticated principal to scope the operation key by: %v", err),
			ErrorData{Type: TypeScopeMissing, Tool: tool, MetaKey: c.MetaKey})
	}
	if len(scope) > receipts.MaxKeyPartLen {
		return nil, newError(CodeUnauthenticated,
			fmt.Sprintf("principal of %d bytes is too long to scope a key by (max %d)", len(scope), receipts.MaxKeyPartLen),
			ErrorData{Type: TypeScopeMissing, Tool: tool, MetaKey: c.MetaKey})
	}

	fp, err := Fingerprint(tool, req.Params.Arguments)
	if err != nil {
		return nil, newError(CodeInvalidParams, err.Error(), ErrorData{Type: TypeInvalidArguments, Tool: tool})
	}

	key := receipts.Key{Scope: scope, ID: id}
	if observe.OperationClass(ctx) == "" {
		// The tool is the operation class: its metrics label, and the
		// estimate behind retryAfterMs (receipts.InProgressError.RetryAfter).
		ctx = observe.WithOperationClass(ctx, tool)
	}
	lease, rec, err := m.claim(ctx, key, fp)
	switch {
	case err != nil:
		return nil, m.claimError(tool, key, err)
	case rec != nil:
		return m.replay(ctx, tool, rec)
	}
	return m.execute(ctx, next, req, lease)
}

// aliasKey reads the key a client sent as params.idempotencyKey, or in
// params._meta[ParamsKeyMetaKey] (moveParamsKey): two different keys there
// (an array of two, moveParamsKey's) are refused as such.
func aliasKey(meta mcp.Meta) (id string, present bool, err error) {
	if two, ok := meta[ParamsKeyMetaKey].([]any); ok && len(two) == 2 {
		return "", true, errors.New("params.idempotencyKey and params._meta[" + strconv.Quote(ParamsKeyMetaKey) + "] hold different keys")
	}
	return operationKey(meta, ParamsKeyMetaKey)
}

// operationKey reads the key from params._meta.
func operationKey(meta mcp.Meta, metaKey string) (id string, present bool, err error) {
	v, ok := meta[metaKey]
	if !ok || v == nil {
		return "", false, nil
	}
	s, ok := v.(string)
	switch {
	case !ok:
		return "", true, fmt.Errorf("want a string, got %s", jsonType(v))
	case s == "":
		return "", true, errors.New("empty")
	case len(s) > receipts.MaxKeyPartLen:
		return "", true, fmt.Errorf("%d bytes (max %d)", len(s), receipts.MaxKeyPartLen)
	}
	return s, true, nil
}

// scope returns the authenticated principal of req.
func (m *middleware) scope(ctx context.Context, req *mcp.CallToolRequest) (string, error) {
	if m.cfg.Scope != nil {
		return m.cfg.Scope(ctx, req)
	}
	if req.Extra != nil && req.Extra.TokenInfo != nil {
		if req.Extra.TokenInfo.UserID == "" {
			return "", errors.New("the bearer token carries no UserID (set it in the TokenVerifier, or set Config.Scope)")
		}
		return req.Extra.TokenInfo.UserID, nil
	}
	if m.cfg.FixedScope != "" {
		return m.cfg.FixedScope, nil
	}
	return "", errors.New("the call is not authenticated (use bearer auth, or set Config.FixedScope for stdio)")
}

// claim claims key, or returns its receipt, with a lease of Config.LeaseFor.
// It waits, Config.Wait at most, for a call in progress under the same key
// (receipts.WaitAtMost). fp is Fingerprint's, behind the middleware's mark;
// a key claimed by a receiptmcp that did not mark its fingerprints (its
// record holds the unmarked one) is claimed with that one.
func (m *middleware) claim(ctx context.Context, key receipts.Key, fp []byte) (*receipts.Lease, *receipts.Receipt, error) {
	l, rec, err := m.db.Claim(ctx, key, fp, m.claimOpts...)
	if errors.Is(err, receipts.ErrIntentMismatch) {
		// One read, not a second claim: a mismatch is counted once. Inspect,
		// not Lookup: no Options.BeforeReplay for a key that is not replayed.
		if cur, lerr := m.db.Inspect(ctx, key); lerr == nil && bytes.Equal(cur.Fingerprint, fp[len(fingerprintMark):]) {
			return m.db.Claim(ctx, key, cur.Fingerprint, m.claimOpts...)
		}
	}
	return l, rec, err
}

// claimError maps an error from Claim to what the client gets.
func (m *middleware) claimError(tool string, key receipts.Key, err error) error {
	c := m.cfg
	var inProgress *receipts.InProgressError
	switch {
	case errors.As(err, &inProgress):
		ms := retryAfterMs(inProgress.RetryAfter)
		return newError(CodeInProgress,
			fmt.Sprintf("a call with this operation key is still running; retry with the same key in %s", time.Duration(ms)*time.Millisecond),
			ErrorData{Type: TypeInProgress, Tool: tool, MetaKey: c.MetaKey, RetryAfterMs: ms})
	case errors.Is(err, receipts.ErrErased):
		return newError(CodeExpired,
			"the data of this operation key's scope was erased; the tool was not run again",
			ErrorData{Type: TypeKeyErased, Tool: tool, MetaKey: c.MetaKey})
	case errors.Is(err, receipts.ErrExpired):
		return newError(CodeExpired,
			"this operation key was used, and its receipt is no longer kept; the tool was not run again (mint a new key only for a new action)",
			ErrorData{Type: TypeKeyExpired, Tool: tool, MetaKey: c.MetaKey})
	case errors.Is(err, receipts.ErrIntentMismatch):
		return newError(CodeInvalidParams,
			"this operation key was already used for a call with another tool or other arguments; mint a new key for a new action",
			ErrorData{Type: TypeKeyConflict, Tool: tool, MetaKey: c.MetaKey})
	case errors.Is(err, receipts.ErrInvalidKey) && !errors.Is(err, receipts.ErrInvalidFingerprint):
		return errKeyInvalid(c, tool, err.Error())
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err // the client is gone
	}
	// The error's text stays in the log: it can name the store's internals
	// (paths, hosts), which are not the client's business.
	c.Logger.Error("receiptmcp: claiming an operation key failed", m.db.LogKey(key), "tool", tool, "err", err)
	return newError(CodeInternal, "the receipt store failed, and the tool was not run; retry with the same operation key", ErrorData{Type: TypeStoreFailure, Tool: tool, MetaKey: c.MetaKey})
}

// replay returns the stored result of rec, marked as a replay.
func (m *middleware) replay(ctx context.Context, tool string, rec *receipts.Receipt) (mcp.Result, error) {
	var res mcp.CallToolResult
	if err := json.Unmarshal(rec.Result, &res); err != nil {
		m.cfg.Logger.ErrorContext(ctx, "receiptmcp: cannot replay stored result",
			m.db.LogKey(rec.Key), "tool", tool, "err", err)
		return nil, newError(CodeInternal, "the stored result cannot be read",
			ErrorData{Type: TypeStoreFailure, Tool: tool, MetaKey: m.cfg.MetaKey})
	}
	meta := maps.Clone(res.Meta)
	if meta == nil {
		meta = make(mcp.Meta, 3)
	}
	meta[m.cfg.ReplayMetaKey] = true
	meta[RecordedAtMetaKey] = rec.UpdatedAt.UTC().Format(time.RFC3339Nano)
	meta[ExpiresAtMetaKey] = rec.ExpiresAt.UTC().Format(time.RFC3339Nano)
	res.Meta = meta
	return &res, nil
}

// execute runs the handler under lease (receipts.Lease.Run, which
// renews the lease, keeps Close waiting and records the outcome) and
// settles the claim before the client sees the result:
//   - a finished result is committed (isError results as Failed receipts);
//   - a result that needs input, or a JSON-RPC error, releases the claim;
//   - any other error, or a panic, abandons it: the outcome is unknown.
func (m *middleware) execute(ctx context.Context, next mcp.MethodHandler, req *mcp.CallToolRequest, lease *receipts.Lease) (mcp.Result, error) {
	tool := req.Params.Name
	a := &Attempt{Key: lease.Key(), Number: lease.Attempt(), Recovered: lease.Recovered(), Token: lease.Token(), ProviderKey: lease.ProviderKey(), lease: lease, steps: stepwatch.New(receipts.ErrStepMismatch, receipts.ErrOutcomeUnknown)}
	// From here on the effect may start: the client going away must neither
	// cut the handler short nor keep its outcome from being recorded.
	hctx := context.WithValue(context.WithoutCancel(ctx), attemptKey{}, a)
	var (
		ran     bool // the handler returned
		res     mcp.Result
		herr    error
		tr      *mcp.CallToolResult // a finished result to store
		effects bool                // tr is a success with staged effects
	)
	_, err := lease.Run(hctx, func(ctx context.Context, _ *receipts.Lease) ([]byte, error) {
		res, herr = next(ctx, methodCallTool, req)
		ran = true
		if err := a.steps.Err("receiptmcp"); err != nil {
			// A step's outcome is unknown, or a step did not match the
			// journal: whatever the tool returned is not the outcome.
			return nil, err
		}
		if herr != nil {
			var je *jsonrpc.Error
			if errors.As(herr, &je) {
				return nil, receipts.NotPerformed(herr)
			}
			return nil, herr
		}
		r, ok := res.(*mcp.CallToolResult)
		if !ok || r == nil {
			return nil, fmt.Errorf("receiptmcp: tool %q returned %T, not a tool result", tool, res)
		}
		if r.NeedsInput() || r.InputRequests != nil {
			// Not finished: the client answers the input requests and
			// calls again, with the same key.
			return nil, receipts.NotPerformed(errNeedsInput)
		}
		result, err := EncodeResult(r)
		if err != nil {
			m.cfg.Logger.WarnContext(ctx, "receiptmcp: cannot store the result; claim abandoned",
				m.db.LogKey(a.Key), "tool", tool, "err", err)
			return nil, err
		}
		tr = r
		if r.IsError {
			return result, receipts.Permanent(errToolError)
		}
		effects = a.staged.Load()
		return result, nil // committed with the staged effects
	})
	switch {
	case !ran: // Close began before the handler could start
		return nil, m.claimError(tool, a.Key, err)
	case a.steps.Err("receiptmcp") != nil:
		return nil, m.stepError(ctx, tool, a, err)
	case herr != nil:
		return nil, herr
	case tr != nil && errors.Is(err, receipts.ErrOutcomeUnknown):
		m.cfg.Logger.ErrorContext(ctx, "receiptmcp: recording the result failed; claim abandoned",
			m.db.LogKey(a.Key), "tool", tool, "err", err)
		if effects {
			// The staged effects did not happen: the client must not take
			// the result for a success.
			return nil, newError(CodeNotRecorded,
				"the tool ran but its outcome could not be recorded; retry with the same operation key",
				ErrorData{Type: TypeNotRecorded, Tool: tool, MetaKey: m.cfg.MetaKey, RetryAfterMs: 1000})
		}
		// The result is what happened; a retry will be told the outcome
		// is uncertain (Recovered).
	}
	return res, nil
}

// stepError answers a call whose step's outcome is unknown
// (CodeNotRecorded) or did not match the key's journal (TypeStepMismatch),
// in place of what the tool returned; err is Run's.
func (m *middleware) stepError(ctx context.Context, tool string, a *Attempt, err error) error {
	name, mismatch := a.steps.Failed()
	if mismatch {
		m.cfg.Logger.ErrorContext(ctx, "receiptmcp: a step does not match the key's journal; claim abandoned for an operator",
			m.db.LogKey(a.Key), "tool", tool, "step", name, "err", err)
		return newError(CodeInternal,
			fmt.Sprintf("step %q does not match the steps recorded for this operation key (the server changed while the call was in flight); nothing was run, and an operator must settle it", name),
			ErrorData{Type: TypeStepMismatch, Tool: tool, MetaKey: m.cfg.MetaKey, Step: name})
	}
	m.cfg.Logger.WarnContext(ctx, "receiptmcp: a step's outcome is unknown; claim abandoned",
		m.db.LogKey(a.Key), "tool", tool, "step", name, "err", err)
	return newError(CodeNotRecorded,
		fmt.Sprintf("the outcome of step %q is unknown; retry with the same operation key: the retry resumes at that step", name),
		ErrorData{Type: TypeNotRecorded, Tool: tool, MetaKey: m.cfg.MetaKey, RetryAfterMs: 1000, Step: name})
}

var (
	errNeedsInput = errors.New("receiptmcp: the tool needs input")
	errToolError  = errors.New("receiptmcp: the tool returned isError")
)

// jsonType names the JSON type of v, as encoding/json decodes it.
func jsonType(v any) string {
	switch v.(type) {
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	case float64, json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}
