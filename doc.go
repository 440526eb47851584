// Package receipts makes retried actions happen once.
//
// An AI agent's tool call (or any client's request) times out; the timeout
// does not prove the action failed, and re-asking the model may produce a
// different call. So the application mints an operation key when a person
// approves an action, keeps it with the pending work, and sends it with every
// transport retry. receipts claims that key, scoped to the authenticated
// caller, for exactly one executor, stores the outcome as a durable receipt,
// and answers every later retry from that receipt:
//
//	approved intent -> stable operation key -> DB.Claim ----> run the effect once
//	                                        -> Commit(result): receipt + effect, one synced batch
//	lost response   -> same operation key   -> Claim returns the stored Receipt (no second effect)
//	same key, other arguments               -> ErrIntentMismatch
//	same key while the first is running     -> ErrInProgress (or wait for its receipt)
//	holder crashed (lease ran out)          -> next caller takes over, told the outcome is uncertain
//
// Most callers use DB.Do:
//
//	fp, _ := encoding.Fingerprint(args)
//	r, err := db.Do(ctx, receipts.Key{Scope: caller, ID: opKey}, fp,
//		func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
//			if l.Recovered() {
//				// a previous attempt's outcome is unknown: ask the provider
//				// about l.ProviderKey() before acting again
//			}
//			return callProvider(ctx, l.ProviderKey(), args)
//		})
//
// # Guarantees
//
//   - A claim is synced before a lease is returned, and a commit before it
//     returns; a receipt once reported committed survives a crash or restart.
//     No caller ever observes a receipt that a crash could still take away.
//     (DoBatch is the one exception: its claim is not synced, because it only
//     guards an effect that commits in the same batch as the receipt.)
//   - One writer per key: read-check-write of a key is serialized in the
//     process, and Pebble's directory lock keeps other processes out.
//   - Fencing: every takeover of an abandoned claim gets a larger token; a
//     holder with a stale token can neither renew nor commit (ErrLeaseLost).
//     Tokens are unique store-wide and never reused, even after GC.
//   - The same key with another fingerprint is rejected, whatever its state.
//   - Receipts, and abandoned claims, stay visible for Options.Retention
//     after their last write and are invisible after that; GC reclaims
//     their space later, O(epochs), not O(receipts).
//   - For Options.TombstoneWindow after that (default 7 × Retention), a
//     retry of the key gets ErrExpired, whatever the fingerprint: a late
//     retry is never a new action. Only a marker of the key is kept, and
//     reclaimed by whole epochs like the receipts.
//   - For effects at external providers, forward Lease.ProviderKey as their
//     idempotency key; a takeover reports Recovered so the new holder
//     reconciles instead of assuming success or failure.
//
// # Unknown outcomes
//
// A claim whose holder crashed, timed out or failed in an unknown way stays
// abandoned until someone settles it: the next client retry (Recovered), or
// the service itself. Scan(Filter{Abandoned: true}) lists them; DB.TakeOver
// takes over exactly a listed one (fenced: it fails if any other attempt
// came in since), so the caller can ask the provider by ProviderKey and
// Commit, Fail, Forget or Abandon. A Reconciler (package reconcile,
// started with reconcile.New) does that in the background: it drives the
// abandoned claims through a user Check with bounded concurrency and
// per-claim backoff, stops on Close (its own or the DB's) and reports what
// it settled (reconcile.Stats, OnSettle).
//
// Effects differ in length: LeaseFor gives one claim (Claim, Do, TakeOver)
// its own lease, renewed by its own length.
//
// # Storage
//
// Open runs the store on Pebble, embedded, in one directory. All its keys
// start with the reserved prefix "\x00rcpt"; the application may keep its
// own data in the same engine (pebblestore.DB) under any other keys, and
// commit them atomically with a receipt: Lease.Stage with an Effect, on
// every engine (on Pebble its unit of work is the batch that carries the
// receipt: pebblestore.Effect), or the Pebble engine's own forms,
// pebblestore.CommitWith, RunBatch and DoBatch. Records are partitioned by
// the epoch of their last write (Retention/4 wide by default), so dropping
// a whole expired epoch is one range deletion.
//
// Retries of recently finished operations are answered through a bounded
// replay cache (pebblestore.Options.ReplayCacheSize), without the key lock
// or decoding: from memory for a small receipt, otherwise with one engine
// read whose bytes must match the cached record's checksum. Only synced
// receipts are cached, so nothing undurable is ever answered; a finished
// receipt never changes while visible, every write of a key drops its entry
// first, and once pebblestore.DB has handed out the engine every replay is
// checked against it again, so a record changed or damaged on disk behind
// the store's back is read exactly as without the cache.
//
// # Engines
//
// The contract above is written once, in this package; a storage engine
// implements the small interface of package driver under it, as a
// database/sql driver does under database/sql, and its package opens a DB
// through OpenEngine: pebblestore for Pebble (receipts.Open is its default
// form) and pgstore for PostgreSQL. This package names no engine's types:
// what only one engine can do lives in its package (pebblestore.DoBatch,
// pgstore.DoTx) and returns ErrUnsupported on another. A program built
// with the receipts_nopebble tag links no Pebble (docs/postgresql.md).
//
// When Pebble cannot make the write-ahead log durable (a failed fsync) it
// stops the process (fail-stop, through its Logger's Fatalf): continuing
// could report a commit that a crash then loses. A restart recovers from
// the log.
//
// Keep secrets and personal data out of keys and results: they are stored as
// given and shown by receiptctl.
package receipts
