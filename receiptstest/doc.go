// Package receiptstest is the conformance kit of the receipts contract:
// every promise of package receipts (DESIGN.md, "Public API" and "Rules that
// make it correct") as a test that runs against any engine that returns a
// *receipts.DB. Both engines run it in CI: Pebble (TestConformance in the
// root package, on disk and on vfs.NewMem) and PostgreSQL (TestConformance
// in package pgstore, a fresh schema per store).
//
// The kit uses only the public API of package receipts. An engine
// implements Store, which opens a new, empty store and reopens the same
// store as a process restart would, and calls Run from a test:
//
//	func TestConformance(t *testing.T) {
//		receiptstest.Run(t, myStore{})
//	}
//
// Run runs each contract test as a subtest named Topic/Behaviour (topics:
// Claim, Orphans, Lease, Wait, Do, Lookup, BeforeReplay, Retention, Tombstones,
// Tokens, Restart, BadInput, Close, Scan, Stats, Corrupt, Check,
// Concurrency, Isolation, Pebble, Observe, LeaseFor, TakeOver,
// Reconciler), so one topic or one behaviour can be selected with go test
// -run. Each test opens its own store with Retention 1h, LeaseTTL 30s,
// background GC off, and Options.Now set to a Clock of its own: time moves
// only when the test moves it, so leases run out and receipts expire without
// sleeping. The engine must take every time it decides by (leases, expiry,
// GC) from Options.Now. (A few tests of background renewal use a 30ms lease
// on the wall clock, and tests with waiters give them a few milliseconds to
// start waiting; no result depends on that.) The Concurrency topic is meant
// to run under -race.
//
// The Tombstones topic opens its stores with TombstoneWindow 3h; an engine
// that keeps no tombstones (it does not implement driver.Tombstones) refuses
// that with receipts.ErrUnsupported, and those tests skip, saying so (its
// KeyTime test runs on every engine). The other topics use the engine's
// default window, and turn tombstones off where they reuse a key right
// after its retention.
//
// The Corrupt topic runs only if the Store also implements Corrupter (it
// damages a stored record). The Check topic skips on an engine whose
// DB.Check returns receipts.ErrUnsupported. A Store whose engine keeps
// times coarser than a nanosecond implements Resolution (PostgreSQL: a
// microsecond), and the few tests that compare a stored time with the
// clock exactly move it by multiples of that. Tests of the Pebble-only methods
// (Lease.CommitWith, DB.DoBatch, DB.Pebble) skip on an engine whose
// DB.Pebble returns nil.
//
// # Front ends
//
// RunHTTP and RunMCP are the conformance suites of the front ends
// (receipthttp, receiptmcp) on any engine: real servers and real clients
// (net/http; the MCP go-sdk over streamable HTTP) for two nodes of a
// service, each with its own middleware. A Store that implements Nodes
// gives each node its own handle on one store (PostgreSQL: two
// pgstore.Open on one schema), as the replicas of a service share a
// database; otherwise both nodes serve the one *receipts.DB. They check that
// a retry on the other node is replayed, racing retries on both nodes run
// the handler once, another payload under a key is refused (422,
// idempotency_key_conflict), a duplicate while the first runs gets 409 /
// CodeInProgress with a retry delay or waits for the replay, a key past
// retention is refused (410 / CodeExpired), a Close during a handler keeps
// its receipt, an effect the handler stages commits with the receipt, both
// or neither (Effects; the kit writes to the Pebble batch itself), and a
// claim settled by hand in the front end's form is replayed. Pebble runs
// them in receipthttp's and receiptmcp's TestConformance, PostgreSQL in
// pgstore's TestFrontEnds.
//
// PebbleStore is the Store of the embedded engine, for tests of this module
// and of code built on it. ScopeIsolation runs the scope-isolation property
// for a given number of checks (tests/isolation runs 10,000).
//
// Environment: RECEIPTSTEST_ISOLATION_CHECKS sets how many random checks the
// scope-isolation property runs (default 300).
//
// Clock is also the fake clock for any other test of this module: pass its
// Now method as Options.Now and move it with Advance or Set.
package receiptstest
