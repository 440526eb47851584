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
package mutate

// Mutation names.
const (
	NoSync   = "nosync"
	NoLock   = "nolock"
	NaiveKey = "naivekey"
	NoFence  = "nofence"
	// StaleCache: the replay cache skips its visibility check.
	StaleCache = "stalecache"
)
