// Package workload is the workload and the checker shared by the crash
// harnesses: power loss (tests/crash), process kills
// (tests/kill) and I/O faults (tests/fault).
//
// Workers run Claim/Commit/Fail/Release/Renew/Do/DoBatch/Lookup on a sliding
// window of keys. Effects go to an external "provider" that survives every
// crash of the store. Every acknowledged call is recorded as an event; after
// a crash the checker compares the reopened store with the events and the
// provider:
//
//   - every acknowledged commit (and every committed outcome a caller saw)
//     is present with its result: lost acknowledged receipts = 0;
//   - no key has two committed outcomes, and a committed result is one some
//     holder of that very token tried to commit, never one the store
//     rejected (ErrLeaseLost);
//   - every acknowledged claim survives (its token, or a newer one), so no
//     fencing token goes backwards, and fresh tokens exceed every token seen;
//   - the provider saw at most one effect per key (duplicate effects = 0),
//     the key of every effect is still claimed, and the receipt names the
//     effect;
//   - DoBatch effects are in the store exactly when their receipt is;
//   - every record decodes (Scan yields no error, Stats.Corrupt == 0).
//
// Leases only run out when the fake clock jumps; a jump waits for every
// holder that is between its lease check (Renew) and its effect, so a holder
// whose lease ran out is a zombie that must be fenced off, never a false
// duplicate. A holder that was taken over reconciles with the provider by
// ProviderKey, as the API tells users to.
package workload
