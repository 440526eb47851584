// Package isolation is the scope-isolation harness (TestScopeIsolation):
// the conformance kit's property (receiptstest.ScopeIsolation, which the
// kit runs as Isolation/Scopes with 300 checks) on Pebble's in-memory FS,
// at a harness's size. The property is over adversarial scopes and IDs
// (separators, NUL bytes, invalid UTF-8, SQL and LIKE metacharacters,
// quotes, parts that are prefixes of each other, 254/255-byte edges, pairs
// that collide under naive concatenation). Each key gets its own
// fingerprint and results; no operation on one key may ever read, replay,
// conflict with or block on another key, and Scan with Filter.Scope returns
// exactly that scope.
//
//	go test -run TestScopeIsolation ./tests/isolation                 # CI: 10,000 checks (1,000 under -race)
//	RECEIPTS_SOAK=1 go test -run TestScopeIsolation ./tests/isolation # 200,000 checks
package isolation
