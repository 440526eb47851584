package pebbleengine

import (
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
)

// record is rec as the root sees it. Its fingerprint and result are rec's.
func (e *Engine) record(k driver.Key, rec *encoding.Record) driver.Record {
	return driver.Record{
		Key:            k,
		Fingerprint:    rec.Fingerprint,
		State:          driver.State(rec.State),
		Result:         rec.Result,
		Attempts:       rec.Attempts,
		Token:          rec.Token,
		CreatedAt:      e.time(rec.CreatedAt),
		UpdatedAt:      e.time(rec.UpdatedAt),
		LeaseExpiresAt: e.time(rec.LeaseExpiresAt),
		ExpiresAt:      e.time(rec.UpdatedAt + e.retention),
		Trace:          rec.Trace,   // never written to: decoded into a new slab, the cache entry's copy, or the memo's bytes
		Journal:        rec.Journal, // the same (the root copies it)
	}
}

// recordCopy is record for a rec whose fingerprint and result alias memory
// the caller must not keep (the engine's bytes): the record gets its own
// copy of both (and of its journal), in one allocation.
func (e *Engine) recordCopy(k driver.Key, rec *encoding.Record) driver.Record {
	r := e.record(k, rec)
	slab := make([]byte, len(rec.Fingerprint)+len(rec.Result)+len(rec.Journal))
	nf := copy(slab, rec.Fingerprint)
	nr := nf + copy(slab[nf:], rec.Result)
	r.Fingerprint = slab[:nf:nf]
	if rec.Result != nil {
		r.Result = slab[nf:nr:nr]
	}
	if rec.Journal != nil {
		copy(slab[nr:], rec.Journal)
		r.Journal = slab[nr:]
	}
	return r
}
