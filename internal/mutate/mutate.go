// Package mutate breaks the engine on purpose, for tests that must show
// that their harness catches a broken engine. Mutations exist only in
// binaries built with the receipts_mutate build tag; without it Name is the
// constant "" and every check compiles away.
//
// With the tag, the RECEIPTS_MUTATION environment variable (read at start)
// selects one mutation:
//
//	nosync    commits and claims are written without sync
//	nolock    claims skip the per-key lock (read-check-write races)
//	naivekey  record keys concatenate scope and id without a length prefix
//	nofence   commits skip the fencing-token check
//	stalecache the replay cache answers for receipts past retention
//	cachekeep  writes of a key keep its replay-cache entry (no Delete)
//	cacheraw   the replay cache answers from memory after the raw Pebble
//	           handle was handed out
//	nocopy     a replay answered from memory hands out the cache's own bytes
//	memokeep   writes of a key keep the memo of its last Pending record (no
//	           delete), so the next write decides from a stale record
//	memoraw    writes decide from the memo of the last write after the raw
//	           Pebble handle was handed out
//	pgnofence  PostgreSQL: Finish (commit, fail) skips the fencing-token check
//	pgnoatomic PostgreSQL: claims skip the per-key advisory lock, the row lock of a
//	           takeover and the unique-key arbitration of a fresh claim, so that
//	           concurrent claims of one key can all win
//	unknownfree the outcome protocol (receipts' Lease.conclude) reads an unknown outcome
//	           (an unmarked error from fn) as NotPerformed: the claim is released,
//	           and the next attempt is not Recovered
//	histshard  the observers' striped counters and histograms (internal/hot,
//	           receiptsprom's and receiptsotel's Producer) read only their first
//	           stripe (the counts other goroutines added elsewhere are lost)
//	otelunmarked receiptsotel: an operation its sampler samples out runs with
//	           the caller's context unmarked, so the operations nested in it
//	           (a Do's claim and commit) draw again and start spans of their own
//	nogcmarkers Pebble's GC drops an epoch's records without writing their
//	           tombstone markers first
//	pgnogcmarkers PostgreSQL: GC drops a records partition without copying its
//	           records' tombstone markers first
//	pgreadnow  PostgreSQL: the read-back after a lost COMMIT reply (DoTx, FinishWith)
//	           reads at once, without waiting for the transaction to end on the server
//	pgwrongpart PostgreSQL: the statements aimed at one records partition (a finish,
//	           a replay's read) are aimed at the partition before the right one
//	stepanypos Lease.Step replays a finished step from the journal's last finished entry,
//	           without checking its position, name or fingerprint
//	steprerun  Lease.Step treats a finished step of the journal as started: it runs again,
//	           Recovered
//	pgrawalias PostgreSQL: a record decoded from its binary columns (rawscan.go) keeps
//	           pgx's read buffer as its byte slices instead of copies
//	reccanon   encoding: the record decoder's fast path for the forms AppendRecord writes
//	           reads a uint 16 as its low byte
//	tallydrop  Do's replays answered at once are not reported to a ReplayObserver
//	           (ObserveReplay is not called)
package mutate

// Mutation names.
const (
	NoSync   = "nosync"
	NoLock   = "nolock"
	NaiveKey = "naivekey"
	NoFence  = "nofence"
	// StaleCache: the replay cache skips its visibility check.
	StaleCache = "stalecache"
	// CacheKeep: the engine's writes of a key skip the replay cache's Delete.
	CacheKeep = "cachekeep"
	// CacheRaw: the replay cache answers from memory although Engine.DB
	// handed out the raw Pebble handle.
	CacheRaw = "cacheraw"
	// NoCopy: the root does not copy a Shared replay's fingerprint and
	// result (the caller gets the replay cache's bytes).
	NoCopy = "nocopy"
	// MemoKeep: the engine's writes of a key skip the delete of its
	// pending-record memo.
	MemoKeep = "memokeep"
	// MemoRaw: writes decide from the pending-record memo although
	// Engine.DB handed out the raw Pebble handle.
	MemoRaw = "memoraw"
	// PgNoFence: pgstore's Finish skips the token check (the record need only be Pending).
	PgNoFence = "pgnofence"
	// PgNoAtomic: pgstore's claim is a plain read-then-write (no lock, no arbitration).
	PgNoAtomic = "pgnoatomic"
	// UnknownFree: the outcome protocol releases the claim of an unknown outcome.
	UnknownFree = "unknownfree"
	// HistShard: the striped counters and histograms (internal/hot) that the
	// observers aggregate into sum only their first stripe when read.
	HistShard = "histshard"
	// OTelUnmarked: receiptsotel's sampled-out operations leave no unsampled trace in their context.
	OTelUnmarked = "otelunmarked"
	// NoGCMarkers: Pebble's GC drops epochs without writing their records' tombstone markers.
	NoGCMarkers = "nogcmarkers"
	// PgNoGCMarkers: pgstore's GC drops records partitions without copying their markers.
	PgNoGCMarkers = "pgnogcmarkers"
	// PgBatchSwap: pgstore answers each member of a batched statement (claims, finishes,
	// replay reads of different keys sent together) with the next member's row.
	PgBatchSwap = "pgbatchswap"
	// PgReadNow: pgstore's read-back after a lost COMMIT reply does not wait for the
	// transaction to end on the server (settledLookup skips the key's lock).
	PgReadNow = "pgreadnow"
	// PgWrongPart: pgstore's statements aimed at one records partition (finishIn,
	// finishManyIn, lookupIn) name the partition before the right one. They check that
	// their row is there, so the parent's statements answer instead, correctly and
	// slower: the tests that count the aimed statements catch it.
	PgWrongPart = "pgwrongpart"
	// StepAnyPos: Lease.Step's journal lookup ignores the position and the name: a finished
	// step replays the last finished entry's result, unchecked.
	StepAnyPos = "stepanypos"
	// StepRerun: Lease.Step treats a finished entry as started (a recorded step runs again).
	StepRerun = "steprerun"
	// PgRawAlias: pgstore's decoding of a record's binary columns (rawscan.go) hands out
	// pgx's read buffer, which the connection's next message overwrites, instead of copies.
	PgRawAlias = "pgrawalias"
	// TallyDrop: DB.Do does not call ObserveReplay for a replay a ReplayObserver takes as
	// one call (doTallied): the replay is reported to nobody.
	TallyDrop = "tallydrop"
	// RecCanon: encoding's decodeCanonical reads a uint 16 as its low byte (msgpack's
	// decoder, the fallback, would not).
	RecCanon = "reccanon"
)
