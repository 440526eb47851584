// Package pgstore is the PostgreSQL engine of receipts (pgx v5): the receipts contract for
// services that run on many nodes sharing one database.
//
// Until the root package consumes the engine seam (package driver), this package holds the
// engine only; pgstore.Open, CommitTx and DoTx are built on it in the seam step.
//
// Schema (format 1, in Options.Schema, default "receipts"):
//
//   - meta: one row: format, epoch width, Retention and LeaseTTL in force, the store's secret, and the
//     maintenance lease (owner, until).
//   - token_seq: the sequence every fencing token comes from (CACHE 1: tokens are unique in
//     the store, increase across sessions and are never reused, also after records are purged).
//   - records: one row per key (scope, id, state, fingerprint, token, attempts, per-attempt
//     nonce, times, result inline), partitioned by epoch = last write / epoch width. Every
//     write moves the row to the current epoch, so a partition is dead once its end plus
//     Retention has passed, and GC drops whole partitions. Partitions are records_e<epoch>.
//
// Tombstones (receipts.Options.TombstoneWindow) are not kept yet: the engine does not
// implement driver.Tombstones, so a positive TombstoneWindow is refused with
// receipts.ErrUnsupported, zero means none (DB.Options reports a negative window), and a
// retry past Retention is a new action. Options.KeyTime works (it needs no engine support).
//
// Time is the database's: every decision uses clock_timestamp() (Options.Now replaces it in
// tests), so nodes whose clocks disagree still agree on leases and expiry. Expiry is exact at
// read time; GC only reclaims space.
//
// Wake-ups across nodes need a LISTEN session outside any transaction pooler (ListenConn).
// Without one (behind PgBouncer in transaction mode, where LISTEN does not work) the engine
// runs in poll-only mode: waiters on a node learn of other nodes' commits by re-reading every
// PollInterval (and by the waiting loop's own re-check), not within a notify flush. NOTIFY
// itself works through any pooler, so nodes that do listen are still woken by poll-only ones.
package pgstore
