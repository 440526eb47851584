// Package receiptmcp makes MCP tool calls happen once, however often a host
// retries them, for servers built with the official Go SDK
// (github.com/modelcontextprotocol/go-sdk).
//
// MCP has no idempotency key of its own, and JSON-RPC request ids are new on
// every retry, so a host that times out and calls tools/call again runs the
// tool twice. With this package the host mints an operation key when a
// person approves the action and sends it with every attempt in
// params._meta["dev.receipts/operationKey"] (outside the arguments the model
// sees). The server's middleware claims the key in a receipts.DB, runs the
// tool once, stores its result as a receipt, and answers every retry from
// that receipt.
//
// # Server
//
//	db, _ := receipts.Open(dir, nil)
//	server := mcp.NewServer(&mcp.Implementation{Name: "workitems"}, nil)
//	mcp.AddTool(server, createWorkItem, create)
//	mcp.AddTool(server, listWorkItems, list)
//	server.AddReceivingMiddleware(receiptmcp.Middleware(db, receiptmcp.Config{
//		Policies: receiptmcp.PoliciesFor(createWorkItem, listWorkItems),
//	}))
//	http.Handle("/mcp", auth.RequireBearerToken(verify, nil)( // TokenInfo.UserID is the scope
//		mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)))
//
// Over stdio there is no token: set Config.FixedScope (the one local user)
// instead.
//
// Inside a tool handler, AttemptFrom(ctx) tells whether an earlier attempt's
// outcome is unknown (Recovered: reconcile first), gives a ProviderKey to
// forward to downstream providers and a fencing Token for downstream writes; Attempt.Stage stages an effect
// (receipts.EffectOn: a *pebble.Batch on the embedded engine, a pgx.Tx on PostgreSQL) that
// commits atomically with the receipt, on every engine.
//
// A tool of several steps (reserve, charge, notify) runs each with
// Attempt.Step (receipts.Lease.Step): a retry resumes the work, finished
// steps are not run again, and the step whose outcome is unknown runs
// again Recovered with the same Step.ProviderKey. Such a step abandons the
// claim and answers CodeNotRecorded with the step's name in data.step; a
// step that does not match the key's journal answers TypeStepMismatch.
//
// # Host (client)
//
//	client := mcp.NewClient(&mcp.Implementation{Name: "host"}, nil)
//	client.AddSendingMiddleware(receiptmcp.ClientMiddleware(""))
//	key := receiptmcp.NewOperationKey() // once, at approval; store it with the approval
//	ctx := receiptmcp.WithOperationKey(ctx, key)
//	res, err := session.CallTool(ctx, params) // retry with the same ctx/key
//
// # What the middleware does
//
// It acts on tools/call only; every other method passes through.
//
//   - Policy (Config.Policies, PolicyFor): Skip passes the call through,
//     Optional guards calls that carry a key, Required rejects calls without
//     one with invalid params (-32602, data.type "idempotency_key_missing").
//     PolicyFor gives read-only tools Skip, idempotent ones Optional, and
//     the rest Required.
//   - Scope: the key belongs to the authenticated principal, never to
//     anything the client says: by default the bearer token's
//     TokenInfo.UserID (auth.RequireBearerToken on streamable HTTP), or
//     Config.FixedScope over stdio, where there is no token. No scope, no
//     service: CodeUnauthenticated, data.type "idempotency_scope_missing".
//     Two principals using the same key never see each other's results.
//   - Fingerprint: the tool name and the canonical form of the parsed
//     arguments (see Fingerprint), never the raw request.
//   - A finished result, isError included, is stored and replayed unchanged
//     to every retry, with _meta["dev.receipts/replayed"] = true, and two
//     more _meta entries that say how old the result is and how long it
//     lasts: "dev.receipts/recordedAt", when it was recorded, and
//     "dev.receipts/expiresAt", until when the key stays protected (every
//     retry until then gets this result; after it, a call with the key runs
//     the tool anew), both RFC 3339 timestamps in UTC (RecordedAtMetaKey,
//     ExpiresAtMetaKey; over HTTP, receipthttp sends the same facts as
//     headers). isError results are stored as Failed receipts.
//   - A result that still needs input (multi round-trip input requests) is
//     not stored: the claim is released, and the call with the answers
//     runs the tool again under the same key.
//   - A handler that returns a JSON-RPC error (*jsonrpc.Error: nothing was
//     done) releases the claim. Any other error, a panic or a crash leaves
//     the outcome unknown: the next attempt, once the claim's lease has run
//     out, runs with Attempt.Recovered.
//   - The same key with another tool or other arguments: invalid params,
//     data.type "idempotency_key_conflict".
//   - A key whose receipt is past retention, within the store's
//     TombstoneWindow (receipts.ErrExpired), or minted too long ago by
//     receipts.Options.KeyTime: CodeExpired (-31410), data.type
//     "idempotency_key_expired". The tool does not run again; mint a new
//     key only if the action is meant to happen again.
//   - The same key while the first call runs: the duplicate waits up to
//     Config.Wait and replays the result; after that it gets CodeInProgress
//     (-31409), data.type "idempotency_key_in_progress", with
//     data.retryAfterMs (the store's estimate of when the result will be
//     there, receipts.InProgressError.RetryAfter).
//   - Once the tool may have started, it runs under a context that the
//     client's cancellation does not cut, and its result is recorded even
//     if the client went away. Handlers must bound their own work:
//     receipts.DB.Close waits for a tool call in progress and for its result
//     to be recorded (receipts.Lease.Run), so a graceful shutdown keeps it.
//
// # Settling by hand
//
// An abandoned claim (its handler failed with an unknown outcome, panicked,
// or its process died) can be settled without waiting for the host's
// retry: by an operator (receiptctl reconcile), or by the service
// (receipts.DB.TakeOver, a reconcile.Reconciler). Its retries are answered
// from the receipt as a tool result, so what is stored must be one: settle
// with SettleResult, or store EncodeResult's bytes (a Reconciler's Check
// returns them), or forget the claim (Lease.Forget) so that the retry runs
// the tool. A result in another form is answered with an internal error
// for the whole retention. The middleware marks the fingerprints it stores
// (Fingerprint), so that the store alone tells its keys apart (Owns);
// receiptctl reconcile refuses to store a raw result for one.
//
// # params.idempotencyKey (SEP-3182)
//
// MCP's closed idempotency proposal, SEP-3182, put the key in
// params.idempotencyKey of tools/call. The middleware takes it as the same
// key as the _meta entry; a call that carries both with different values
// is refused (invalid params, data.type "idempotency_key_invalid"). The Go
// SDK decodes params into mcp.CallToolParamsRaw, which has no such field,
// before any middleware runs, so the middleware cannot see the field
// itself: wrap the streamable HTTP handler with AcceptIdempotencyKeyParam
// (or a transport you connect yourself with
// AcceptIdempotencyKeyParamTransport), which moves it into
// params._meta[ParamsKeyMetaKey] on the raw message.
//
// # Fencing downstream writes
//
// A tool call's claim can be taken over while its handler still runs: its
// process stalled past the lease, or its result could not be recorded. The
// middleware's lease is fenced (a stale holder records nothing), but a write
// the handler makes to another system is not, unless that system checks
// the token. Attempt.Token is the claim's fencing token: it is larger for
// every later attempt. Keep, next to the data an operation writes, the
// largest token that wrote it, and apply a write only while its token is
// larger:
//
//	a, _ := receiptmcp.AttemptFrom(ctx)
//	tag, err := conn.Exec(ctx, `UPDATE work_items SET title = $1, fence = $2
//	                              WHERE id = $3 AND fence < $2`, title, a.Token, id)
//	if err == nil && tag.RowsAffected() == 0 {
//		// A newer attempt has written: this one is stale; stop.
//	}
//
// (For a row that may not exist yet: INSERT ... ON CONFLICT (id) DO UPDATE
// SET ... WHERE work_items.fence < EXCLUDED.fence.) A stale attempt's
// writes then change nothing, whenever they land; see the example of
// Attempt. Effects staged with Attempt.Stage need no fence: they commit
// with the receipt, which is fenced.
//
// Errors carry ErrorData in the JSON-RPC error's data; ParseError reads it
// on the client.
package receiptmcp
