// Package receipthttp is net/http middleware that makes a retried request
// happen once. It implements the IETF draft "The Idempotency-Key HTTP Header
// Field" (draft-ietf-httpapi-idempotency-key-header) with the behaviour
// Stripe's API made familiar, on top of a receipts.DB.
//
// A client mints a key when an action is approved and sends it, unchanged,
// with every retry of that request:
//
//	POST /v1/work-items
//	Idempotency-Key: 8e03978e-40d5-43e8-bc93-6894a57f9324
//
// The key is scoped by Config.Scope (the authenticated caller), so keys of
// two callers never meet. The value may be bare or a Structured Field string
// ("...", the draft's form); it must be 1-255 bytes of printable ASCII. More
// than one key is refused with 400: two header lines, a list, or a comma in
// a bare value (how an intermediary joins two lines); quote a key that has a
// comma.
//
// # Outcomes
//
//   - First request with a key: the handler runs once. Its response is held
//     back, recorded as a receipt (status, the Config.StoredHeaders, body),
//     and only then sent, so a client never sees a response a crash could
//     take back.
//   - Retry with the same key and payload: the stored response is replayed
//     without running the handler, with the headers of a replay (below).
//   - Same key, different payload (method, path or body by default; see
//     Config.Fingerprint): 422.
//   - Same key while the first request is still running: 409 with
//     Retry-After (the store's estimate of when the response will be there,
//     receipts.InProgressError.RetryAfter, rounded up to whole seconds), or, with Config.Wait, the duplicate waits (bounded) for
//     the first response and gets it replayed.
//   - A key whose stored response is past retention, within the store's
//     TombstoneWindow (receipts.ErrExpired), or minted too long ago by
//     receipts.Options.KeyTime: 410 Gone (ProblemKeyExpired); the handler
//     does not run.
//   - No key on a guarded method when Config.Required: 400. A key that is
//     empty, over 255 bytes, not printable ASCII, or sent twice: 400.
//   - Body over Config.MaxBodyBytes: 413. The body is read in full before
//     the handler runs (the fingerprint needs it); the handler gets a copy.
//   - Unauthenticated (Config.Scope fails): 401, or the *Problem it returns.
//
// # Replays
//
// A response served from a receipt carries, besides the stored status,
// headers and body:
//
//	Idempotent-Replayed: true
//	Idempotency-Recorded-At: Fri, 02 Jan 2026 03:04:05 GMT
//	Idempotency-Expires-At: Sat, 03 Jan 2026 03:04:05 GMT
//
// Idempotent-Replayed (ReplayedHeader) is Stripe's name for the same mark.
// Idempotency-Recorded-At (RecordedAtHeader) is when the original response
// was recorded, so a client can tell how old the answer is.
// Idempotency-Expires-At (ExpiresAtHeader) is until when this receipt
// answers: until then every retry with the key is answered from it; after
// it (the store's Options.Retention past the recording), for the store's
// Options.TombstoneWindow, a request with the key gets 410 Gone, and only
// then runs as a new one. The IETF draft defines no response header
// for this (its issue #35 asks for one), so the names follow the draft's
// Idempotency- prefix; both are HTTP-dates (RFC 9110, the format of
// Last-Modified and Expires), rounded down to the second. They are set by
// the middleware on every replay and override stored headers of the same
// names.
//
// A store's Options.BeforeReplay runs before every replay; an error it
// returns answers 500, or, when the error is (or wraps) a *Problem, that
// problem (say, 403 for a caller who lost access).
//
// Every error the middleware writes itself is application/problem+json
// (RFC 9457, see Problem and WriteProblem), through Config.ErrorResponder.
//
// # What is stored
//
// Config.Policy maps the handler's status to an Outcome. DefaultPolicy
// stores 2xx and 3xx as Succeeded and 4xx as Failed receipts (both are
// replayed), releases the key on 409 and 429 (the handler declined to act,
// so a retry runs it again), and abandons the claim on 5xx. A handler that
// panics abandons its claim too (the panic goes on to net/http). An
// abandoned claim's outcome is unknown: its lease ends at once
// (Lease.Abandon), and the next retry runs the handler as a recovered
// attempt, which it can tell from AttemptFrom(ctx)
// (Recovered, Number) and should reconcile, for example by looking its
// effect up under Attempt.ProviderKey, the key to forward to downstream
// providers.
//
// A handler whose effect lives in the same database as the receipts can
// stage it with Attempt.Stage (receipts.EffectOn: a *pebble.Batch on the
// embedded engine, a pgx.Tx on PostgreSQL): it commits with the stored
// response in the engine's unit of atomic work (receipts.Lease.Stage), so
// the effect and its receipt are durable together or not at all, on every
// engine.
//
// A handler of several steps (reserve, charge, notify) runs each with
// Attempt.Step (receipts.Lease.Step): a retry resumes the work, finished
// steps are not run again, and the step whose outcome is unknown runs
// again as recovered with the same Step.ProviderKey. Such a step abandons
// the claim and answers 503 ProblemNotRecorded with the step's name in the
// problem's "step" member, whatever the handler writes after it; a step
// that does not match the key's journal answers 500 ProblemStepMismatch.
//
// # Settling by hand
//
// An abandoned claim (its handler answered 5xx, panicked, or its process
// died) can be settled without waiting for the client's retry: by an
// operator (receiptctl reconcile), or by the service (receipts.DB.TakeOver,
// a reconcile.Reconciler). Its retries are answered from the receipt as an
// HTTP response, so what is stored must be one: settle with
// SettleResponse, or store EncodeResponse's bytes (a Reconciler's Check
// returns them), or forget the claim (Lease.Forget) so that the retry runs
// the handler. A result in another form is answered with 500 for the whole
// retention. The middleware marks the fingerprints it stores, so that the
// store alone tells its keys apart (Owns); receiptctl reconcile refuses to
// store a raw result for one.
//
// # Fencing downstream writes
//
// A handler's claim can be taken over while the handler still runs: its
// process stalled past the lease (a GC pause, a partition), or its response
// could not be recorded. The middleware's lease is fenced (a stale holder
// records nothing), but a write the handler makes to another system is not,
// unless that system checks the token. Attempt.Token is the claim's fencing
// token: it is larger for every later attempt. Keep, next to the data an
// operation writes, the largest token that wrote it, and apply a write only
// while its token is larger:
//
//	a, _ := receipthttp.AttemptFrom(r.Context())
//	tag, err := conn.Exec(ctx, `UPDATE work_items SET title = $1, fence = $2
//	                              WHERE id = $3 AND fence < $2`, title, a.Token, id)
//	if err == nil && tag.RowsAffected() == 0 {
//		// A newer attempt has written: this one is stale; stop.
//	}
//
// (For a row that may not exist yet: INSERT ... ON CONFLICT (id) DO UPDATE
// SET ... WHERE work_items.fence < EXCLUDED.fence.) A stale attempt's writes
// then change nothing, whenever they land; see the example of Attempt. The
// effects staged with Attempt.Stage need no fence: they commit with the
// receipt, which is fenced.
//
// # Disconnects
//
// Once the key is claimed the handler runs under a context that the
// client's disconnect does not cancel (context.WithoutCancel of the
// request's), so an effect that has started is always recorded. The context
// is cancelled if the claim's lease is lost to a takeover. The lease is
// renewed in the background while the handler runs, and receipts.DB.Close
// waits for the handler and for its response to be recorded, so a graceful
// shutdown mid-request keeps the receipt (receipts.Lease.Run). If the
// response cannot be recorded, the claim is abandoned and the client gets
// 503 ProblemNotRecorded; its retry runs as a recovered attempt at once.
//
// # Streaming and hijacking
//
// A response cannot be both streamed and held back. If the handler flushes
// (http.Flusher, http.ResponseController), hijacks the connection, or
// writes a body larger than Config.MaxResponseBytes, the response is passed
// through to the client as it is written and no receipt is stored: the
// claim is abandoned, so a retry is a recovered attempt. Do not put
// streaming endpoints behind this middleware. Informational (1xx) responses
// are dropped.
//
// Requests with unguarded methods (Config.Methods, default POST and PATCH),
// and requests without a key when the key is optional, pass through
// untouched.
package receipthttp
