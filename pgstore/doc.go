// Package pgstore is the PostgreSQL engine of receipts (pgx v5): the receipts contract for
// services that run on many nodes sharing one database.
//
// Open returns the same *receipts.DB the Pebble engine does (receipts.Open), served by
// PostgreSQL: Claim, Do, Lookup, Scan, Stats, GC, the Reconciler and the front ends built on
// them (receipthttp, receiptmcp, receiptadmin) work unchanged, on every node that opens the
// same database and schema. The contract kit (package receiptstest) runs on this engine in
// its tests, with two nodes.
//
// Effects that commit with the receipt go through the engine seam (driver.Effects): an
// Effect staged on a lease (receipts.Lease.Stage, receipthttp's and receiptmcp's
// Attempt.Stage), written with receipts.EffectOn for a pgx.Tx, runs in a transaction that
// holds the lease's row (BEGIN; SELECT … FOR UPDATE by token; the effect; the finish and
// COMMIT in one batch), so the effect and the receipt commit together or not at all.
// DoTx and CommitTx (with FenceTx) are this engine's own forms, for a transaction the
// application runs itself; DoTx's fn runs under receipts.Lease.Run, so its outcome follows
// the contract's rules exactly as Do's, carried out in its transaction.
//
// Schema (format 4, in Options.Schema, default "receipts"):
//
//   - meta: one row: format, epoch width, Retention and LeaseTTL in force, the store's secret, the
//     maintenance lease (owner, until), and clock: the latest time the store has used (written
//     by Close and by every GC pass; added to schemas created before it).
//
//   - token_seq: the sequence every fencing token comes from (CACHE 1: tokens are unique in
//     the store, increase across sessions and are never reused, also after records are purged).
//
//   - records: one row per key (scope, id, state, fingerprint, token, attempts, per-attempt
//     nonce, times, result inline, trace context, step journal), partitioned by epoch = last write / epoch width. Every
//     write moves the row to the current epoch, so a partition is dead once its end plus
//     Retention has passed, and GC drops whole partitions. Partitions are records_e<epoch>.
//
//   - markers: tombstones (receipts.Options.TombstoneWindow, default 7 × Retention, as on
//     Pebble), partitioned by epoch too, but each partition k record epochs wide (k =
//     (Retention + TombstoneWindow) / (4 × epoch width), at least 1, recorded in meta;
//     markers_e<first epoch>, created with the records' partitions). No record write writes
//     a marker: a record past Retention is its own tombstone until GC drops its partition,
//     and GC, before it drops a records partition, copies the markers (scope, id, epoch,
//     used_at = the record's last write) of its records still within the window with one
//     INSERT … SELECT from the partition, committed before the DETACH, so a crash leaves the
//     records or the markers, never neither. A key without a visible record whose newest
//     write (a marker, or a record in a partition GC has not dropped) is within Retention +
//     TombstoneWindow is tombstoned: a claim of it answers receipts.ErrExpired, whatever the
//     fingerprint; the first call's insert checks it in the same statement (NOT EXISTS on
//     markers and on the records partitions below the live ones, which GC keeps few), so
//     tombstones cost no round trip and no write. Release of a first attempt and Forget
//     delete the record: there is nothing to copy. GC drops a markers partition once its end
//     plus Retention plus TombstoneWindow has passed (the longest any node recorded):
//     O(partitions) statements, as for records (one more per records partition: the copy).
//     Negative TombstoneWindow turns them off (a retry past Retention is a new action). The
//     schema format is 3; Open migrates format 1 (before tombstones) and format 2 (whose
//     writes wrote a marker beside every record: those markers stay in force; format 3 only
//     changes the number, so that a format-2 binary, whose GC would drop records without
//     their markers, refuses the store). records.meta is reserved (NULL).
//
// Time is the database's: every decision uses clock_timestamp() (Options.Now replaces it in
// tests), so nodes whose clocks disagree still agree on leases and expiry. It never runs
// backwards for a node: every statement's time is at least the latest the node has used (its
// high-water mark, which starts at Open from meta.clock and the newest partition holding
// records), so a clock stepped back lets no lease be taken over early and no receipt expire
// early. Times are kept to the microsecond (timestamptz). Expiry is exact at read time; GC
// only reclaims space.
//
// Round trips. A first call's claim is one (one statement in its own transaction: the key's
// advisory lock, the scope's check and the insert if absent, in a function: a claim committed
// after the DB's Close began is undone, so no lease is handed out once Close has begun), and
// Do's commit another: two statements and two round trips, as the plainest correct design's.
// A key that already has a record takes the gated claim statement ([BEGIN; fresh; claim],
// then COMMIT once the engine has checked that Close has not begun). A
// retry of a finished operation is one round trip on any node: on a node that recently saw
// it finished (a bounded hint of key hashes and their records' epochs), one plain MVCC read
// of the one partition that holds the record (no transaction, no lock, nothing written; the
// parent's read if the record has moved since); on another node, the first call's batch, whose insert-if-absent statement
// returns the finished record instead. DoTx's first call is two round trips too: the claim
// batch begins its transaction, and the receipt's write is sent with COMMIT.
//
// Batches. Under load the server's work for a first claim or a finish is mostly per
// statement and per transaction (the plan over the partitions, parse, bind and execute, the
// lock's statement, BEGIN, COMMIT and its WAL flush), not per key. So while two claim
// transactions are in flight, first claims that arrive wait, and the next caller sends them
// together, up to 32 distinct keys, in one transaction: the advisory lock of every key that is
// free (pg_try_advisory_xact_lock: a batch never waits for a key another transaction holds,
// a DoTx running its effect say, and takes part in no deadlock; such a key claims alone),
// then the insert-if-absent statement over the locked keys, then COMMIT; each key gets the
// decision its own statement would have made. Finishes aimed at the same partition are
// batched the same way, in one fenced UPDATE. A server error rolls a batch back and each
// call is sent alone; a lost reply is a lost reply for each member (its nonce, or its
// recorded outcome, recognises what landed); a caller that leaves while its batch is in
// flight has the claim it was granted undone. With fewer concurrent callers nothing waits
// and every call is sent alone. At 64 callers on a 2-vCPU machine this is what puts Do ahead of the
// two plain statements (bench/README.md). DoTx is never batched: its transaction is the
// caller's.
//
// No claim without a holder. A claim's transaction, alone or in a batch, runs on a goroutine
// of its own, on a context that only Close cancels (with the caller's values), and the caller
// waits for it or for its own context: a caller whose context ends returns that error at once,
// but its context never cuts a claim's COMMIT short, so the claim's answer always comes in
// (pgx, on a context that ends mid-statement, closes the connection and sends a cancel
// request; the claim could commit with nobody told). A claim granted to a caller who has
// gone is undone by its token: a first attempt's record is deleted (the key is free, as if
// never claimed), a takeover's is abandoned again (the next attempt is Recovered, as it would
// have been); a caller who leaves before the COMMIT is sent has it rolled back. A claim whose
// reply was lost to a broken connection is retried with its nonce while the caller waits; if
// the caller leaves first, the engine waits until the backend it was sent to has finished,
// looks the claim up by its nonce and undoes it if it landed. This work runs on a context
// detached from the caller's and bounded (10 s, and Close, which waits for it up to that
// long). A Claim that returns an error leaves no claim behind (TestClaimErrorLeavesNoClaim,
// and the kit's Orphans topic, which counts the keys left Pending by first claims with
// deadlines of 0.3 to 2.7 ms: 24 to 32 of about 700 failed claims before, 0 now). DoTx's claim
// is committed only with its receipt, in DoTx's transaction, so one that returns an error has
// committed nothing of its own (TestDoTxErrorLeavesNoClaim).
//
// High availability (docs/postgresql-ha.md). A receipt reported committed survives a failover
// to a standby only if the standby had its COMMIT: synchronous replication with
// synchronous_commit = on (or remote_apply; remote_write acknowledges what the standby has
// written but not flushed), a synchronous or quorum standby, and a failover manager that
// promotes only a standby that has every acknowledged commit (Patroni's synchronous_mode_strict,
// or its quorum mode). The engine adds what the server cannot: a COMMIT whose wait for the
// standby was cancelled (pg_cancel_backend, pg_terminate_backend, a client's cancel request),
// which PostgreSQL commits on the primary only and answers COMMIT with a warning, is never
// reported committed: every COMMIT the engine sends goes through one check of the warning
// (the pool's notice handler, which Configure installs; on a pool built without it, Open and
// claims fail with ErrPoolNotConfigured while synchronous_standby_names is set), and such a
// commit is an unknown outcome (ErrNotReplicated: a claim is undone and not handed out, Do
// returns ErrOutcomeUnknown); what the engine reads back after a lost reply is read once the
// transaction has ended on the server (DoTx's and a staged effect's: they hold the key's
// advisory lock to their end), and reported only once a commit of its own after it is
// confirmed by the standby. The engine never cancels a COMMIT it
// sent, whatever the pool's pgx settings: its COMMITs run on contexts the caller's cannot
// cancel (claims and writes in a goroutine of their own when the caller's context can end),
// so neither pgx's deadline, which closes the connection and sends a cancel request, nor
// pgx's CancelRequestContextWatcherHandler reaches one. statement_timeout does not interrupt a
// COMMIT's wait on PostgreSQL 15, and a cancel that does is caught by the check. Open logs
// synchronous_commit, synchronous_standby_names, the synchronous standbys streaming
// (pg_stat_replication) and whether the session is on a primary; the engine reads them again
// every second for its metrics (postgres_sync_standby_up and others, DB.EngineMetrics) and for
// Options.RequireSyncStandby, which refuses to open and to claim without a streaming
// synchronous standby. A multi-host DSN (host=a,b target_session_attrs=read-write) lets pgx
// find the new primary; lost replies are retried, and the LISTEN session reconnects, waiters
// polling meanwhile.
//
// Tokens across a promotion. token_seq cannot hand out a token twice across a promotion of a
// synchronous standby. PostgreSQL WAL-logs a sequence ahead of its use (one record covers the
// next 32 values, written before nextval returns the first of them), and the claim that used
// a token commits after that record; its COMMIT is acknowledged only once the standby has
// flushed the WAL up to the commit record, so the standby has the sequence's record covering
// every token an acknowledged claim holds. After the promotion nextval continues above the
// last value logged: every token of the new primary is larger than every token handed out
// before. A token whose claim was not acknowledged may come again, but nobody holds it: the
// engine hands out no claim it has not seen confirmed. With asynchronous replication the
// standby may lack the sequence's newest record, and the new primary hands out again tokens
// that acknowledged claims of the old one hold, so tokens no longer only grow, and fencing
// that compares them (FenceTx, the effect's own fence column) can let an old holder through.
// TestCancelledClaimWait and the failover harness (tests/pgnodes, TestFailover) check that
// every token after a promotion is above every earlier one; TestFailoverAsync shows tokens
// handed out twice.
//
// Wake-ups across nodes need a LISTEN session outside any transaction pooler (ListenConn).
// Without one (behind PgBouncer in transaction mode, where LISTEN does not work) the engine
// runs in poll-only mode: waiters on a node learn of other nodes' commits by re-reading every
// PollInterval (and by the waiting loop's own re-check), not within a notify flush. NOTIFY
// itself works through any pooler, so nodes that do listen are still woken by poll-only ones.
//
// DB.Check reads meta, token_seq and every row of records in one read-only snapshot and
// reports rows that break the engine's invariants (a state, fingerprint, attempts, token or
// lease that the engine never writes; a row outside the partition of its last write; a key
// visible in two partitions) and live partitions that were detached.
package pgstore
