// Package peek gives this module's own harnesses and benchmarks the Pebble
// database under a receipts.DB without handing it out: DB.Pebble (the
// engine's DB) turns off the replay cache's answers from memory, since its
// caller may write the store's keys behind the engine's back. The callers
// of Pebble here only read their own keys, flush or compact, none of which
// changes a record, so the store they test keeps answering as a user's
// that never asks for the handle.
package peek

import "github.com/cockroachdb/pebble/v2"

// Pebble returns the Pebble database of db, a *receipts.DB (nil on another
// engine). Package receipts sets it. Only read, flush or compact with it.
var Pebble func(db any) *pebble.DB
