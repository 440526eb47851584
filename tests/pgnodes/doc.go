// Package pgnodes is the cross-node reliability harness of issue 14: several node processes
// (the test binary re-executed) share one store, with eight workers each on overlapping keys,
// while the parent SIGKILLs nodes, restarts the database and cuts node↔database connections
// through an in-test TCP proxy. Every effect goes to an fsynced provider log and every receipt a
// worker was told about goes to an fsynced ack log; the checker then proves, from those logs and
// from every node's final view of the store:
//
//   - 0 duplicate effects: no key has two effect calls in the provider log. An attempt that
//     took over an unknown outcome (Lease.Recovered) reconciles first, as a real caller does:
//     it asks the provider whether an effect with its ProviderKey exists, and if so adopts it
//     (commits a result naming that effect) instead of performing a second one. So a SIGKILL
//     between the effect and the commit leaves one effect, and the next attempt commits a receipt
//     that names it; an effect made by a lease that was not the key's only live claim (broken
//     claim atomicity) or by a holder fenced out too late shows up as a second effect line.
//     What no engine can prevent is not tested: an effect made after the holder's lease may
//     have run out (only a provider that checks the token could refuse it). So a worker makes
//     its effect right after it is granted the lease, and the workload's stale holders sleep
//     past their lease after the effect, before they try to commit (which fencing must refuse
//     once another attempt took the key over).
//   - 0 lost acknowledged receipts: every Succeeded or Failed receipt a worker was told about
//     (state, result, token, attempts) is what every node reads at the end, by Lookup and by a
//     Do that must replay without calling fn; every finished receipt names the key's one effect,
//     and (after a settle pass that lets every abandoned claim be taken over and reconciled)
//     every effect has a receipt.
//   - no token handed out twice: a token names one grant (one key, one attempt, one operation)
//     across grants, effects and receipts of every node.
//   - linearizability (porcupine) of the cross-node history per key, against a model in which
//     a key is granted to ever-larger tokens until one grant's commit finishes it, a commit
//     succeeds only for the key's newest grant (fencing), and every later read returns the
//     finished receipt.
//
// The failover harness (failover_test.go, issue 34) runs the same workload on a primary and a
// streaming standby reached through one multi-host DSN, SIGKILLs the primary's postmaster and
// promotes the standby: with synchronous replication the checks above hold across it, and
// every token after a promotion is above every earlier one; with asynchronous replication it
// reports what the failover lost instead of failing.
//
// The harness is parameterised by an [OpenFunc], so the same code runs on the Pebble engine (one
// process at a time, on one directory) and on PostgreSQL (several processes on one database).
package pgnodes
