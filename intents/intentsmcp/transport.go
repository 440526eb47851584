// Package intentsmcp delivers the actions of an intents.Journal as MCP
// tool calls, through the official Go SDK's client: the action's key goes
// in params._meta["dev.receipts/operationKey"], where receiptmcp reads it.
//
//	client := mcp.NewClient(&mcp.Implementation{Name: "host"}, nil)
//	tr := intentsmcp.New(func(ctx context.Context) (*mcp.ClientSession, error) {
//		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
//	}, nil)
//	defer tr.Close()
//	d, _ := intents.NewDispatcher(journal, intents.DispatcherOptions{
//		Transports: map[string]intents.Transport{"workitems": tr},
//	})
//
// An action's Operation is the tool's name and its Arguments the tool's
// arguments. Answers (see intents.State):
//   - a tool result: Succeeded, or Failed when isError is set (receiptmcp
//     stores both and replays them);
//   - idempotency_key_conflict: Conflict; idempotency_key_expired: Expired;
//   - idempotency_key_in_progress, idempotency_outcome_not_recorded,
//     idempotency_store_failure, any other internal error, and a broken
//     session: no answer yet; the Dispatcher retries, after
//     data.retryAfterMs when the error has it, on a new session if the
//     old one broke; a data.step string names the step of the service's
//     action whose outcome is unknown (intents.Action.UncertainStep);
//   - any other JSON-RPC error (unknown tool, invalid params, a missing
//     scope): Failed, since sending it again would get the same.
//
// Nothing here reads the result's _meta["dev.receipts/replayed"]: it only
// fills Answer.Replayed, for people. Some client frameworks drop _meta from
// results, and the host does not need it to be correct.
package intentsmcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/receiptmcp"
)

// Options configures a Transport.
type Options struct {
	// MetaKey is the params._meta entry the key goes in. Default
	// receiptmcp.DefaultMetaKey.
	MetaKey string
}

// Transport is an intents.Transport over an MCP client session. It
// connects on first use and again after a session breaks (a server
// restart ends a streamable HTTP session). It is safe for concurrent use.
type Transport struct {
	connect func(context.Context) (*mcp.ClientSession, error)
	metaKey string

	mu      sync.Mutex // protects session and closed
	session *mcp.ClientSession
	closed  bool
}

// New returns a Transport that gets its sessions from connect.
func New(connect func(context.Context) (*mcp.ClientSession, error), opts *Options) *Transport {
	if connect == nil {
		panic("intentsmcp: New needs a connect function")
	}
	t := &Transport{connect: connect, metaKey: receiptmcp.DefaultMetaKey}
	if opts != nil && opts.MetaKey != "" {
		t.metaKey = opts.MetaKey
	}
	return t
}

// Close closes the current session. Deliver fails with intents.ErrClosed
// afterwards.
func (t *Transport) Close() error {
	t.mu.Lock()
	s := t.session
	t.session, t.closed = nil, true
	t.mu.Unlock()
	if s != nil {
		return s.Close()
	}
	return nil
}

// sessionFor returns the current session, connecting if there is none.
func (t *Transport) sessionFor(ctx context.Context) (*mcp.ClientSession, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, intents.ErrClosed
	}
	if t.session != nil {
		return t.session, nil
	}
	s, err := t.connect(ctx)
	if err != nil {
		return nil, fmt.Errorf("intentsmcp: connect: %w", err)
	}
	t.session = s
	return s, nil
}

// drop closes s if it is still the current session.
func (t *Transport) drop(s *mcp.ClientSession) {
	t.mu.Lock()
	if t.session == s {
		t.session = nil
	} else {
		s = nil
	}
	t.mu.Unlock()
	if s != nil {
		_ = s.Close()
	}
}

// Deliver implements intents.Transport.
func (t *Transport) Deliver(ctx context.Context, a *intents.Action) (*intents.Answer, error) {
	s, err := t.sessionFor(ctx)
	if err != nil {
		return nil, err
	}
	params := &mcp.CallToolParams{
		Meta:      mcp.Meta{t.metaKey: a.Key},
		Name:      a.Operation,
		Arguments: json.RawMessage(a.Arguments),
	}
	res, err := s.CallTool(ctx, params)
	if err != nil {
		return classify(a, err, func() { t.drop(s) })
	}
	body, err := json.Marshal(res)
	if err != nil {
		return nil, fmt.Errorf("intentsmcp: %s: encode the result: %w", a.Operation, err)
	}
	ans := &intents.Answer{State: intents.Succeeded, Body: body}
	if res.IsError {
		ans.State = intents.Failed
	}
	if v, ok := res.Meta[receiptmcp.DefaultReplayMetaKey].(bool); ok && v {
		ans.Replayed = true
	}
	return ans, nil
}

// classify maps a tools/call error to an answer or a retry. broken is
// called when the session itself failed.
func classify(a *intents.Action, err error, broken func()) (*intents.Answer, error) {
	var je *jsonrpc.Error
	if !errors.As(err, &je) {
		// No JSON-RPC answer. If the attempt's time ran out, the session
		// may be fine (the tool is slow); otherwise the connection or the
		// session broke: start over on a new one.
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			broken()
		}
		return nil, fmt.Errorf("intentsmcp: %s: %w", a.Operation, err)
	}
	var wrapped error = fmt.Errorf("intentsmcp: %s: %w", a.Operation, err)
	// stepped names the step the error's data reports uncertain, if any.
	stepped := func(err error) error {
		if step := intents.StepOf(je.Data); step != "" {
			return &intents.StepError{Step: step, Err: err}
		}
		return err
	}
	failed := func(state intents.State, code string) (*intents.Answer, error) {
		return &intents.Answer{State: state, Code: code, Body: errorBody(je)}, nil
	}
	if _, d, ok := receiptmcp.ParseError(err); ok {
		wrapped = fmt.Errorf("intentsmcp: %s: %s: %w", a.Operation, d.Type, err)
		switch d.Type {
		case receiptmcp.TypeInProgress, receiptmcp.TypeNotRecorded, receiptmcp.TypeStoreFailure:
			wrapped = stepped(wrapped)
			if d.RetryAfterMs > 0 {
				return nil, &intents.RetryError{After: d.RetryAfter(), Err: wrapped}
			}
			return nil, wrapped
		case receiptmcp.TypeKeyConflict:
			return failed(intents.Conflict, d.Type)
		case receiptmcp.TypeKeyExpired:
			return failed(intents.Expired, d.Type)
		}
		return failed(intents.Failed, d.Type)
	}
	switch je.Code {
	case jsonrpc.CodeInvalidParams, jsonrpc.CodeMethodNotFound, jsonrpc.CodeInvalidRequest, jsonrpc.CodeParseError:
		return failed(intents.Failed, fmt.Sprintf("jsonrpc/%d", je.Code))
	}
	return nil, stepped(wrapped) // internal errors and the like: try again
}

// errorBody is the JSON-RPC error as the answer's body.
func errorBody(je *jsonrpc.Error) []byte {
	b, _ := json.Marshal(je) // code, message, data: cannot fail
	return b
}
