package pebbleengine

import (
	"bytes"
	"context"
	"fmt"
	"iter"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
)

// Scan yields the visible records that match f, in storage order (by epoch
// of last write, then scope, then ID), from a consistent snapshot. A record
// that does not decode is yielded as an error wrapping driver.ErrCorrupt,
// and the scan goes on if the caller continues.
func (e *Engine) Scan(ctx context.Context, f driver.Filter) iter.Seq2[driver.Record, error] {
	return func(yield func(driver.Record, error) bool) {
		now := e.now()
		n := 0
		for r, err := range e.records(ctx, now, f.Scope) {
			if err != nil {
				if !yield(driver.Record{}, err) {
					return
				}
				continue
			}
			if f.State != 0 && r.State != f.State {
				continue
			}
			if f.Abandoned && (r.State != driver.Pending || e.time(now).Before(r.LeaseExpiresAt)) {
				continue
			}
			if !yield(r, nil) {
				return
			}
			if n++; f.Limit > 0 && n >= f.Limit {
				return
			}
		}
	}
}

// syncVisible makes durable every write that an iterator opened before it
// can see, with one synced, empty WAL record (pebble.DB.LogData); call it
// after opening the iterator and before reporting anything it shows.
//
// Pebble publishes a committed batch to iterators after writing it to the
// WAL but before that write's fsync returns, so an iterator can see a claim
// or a receipt that a power loss then takes away. The key lock covers the
// readers that take it (Claim, Lookup: writers hold it across their sync);
// the readers that iterate (Scan and so the admin handler's list, Count)
// take no key lock. The WAL is written in sequence order and synced in
// order (a log is synced before the next one is used), so once a record
// written after every batch the iterator can see is synced, every one of
// them is durable: the unsynced ones too (renewals, DoBatch claims). That
// costs one fsync per scan, shared with concurrent commits by Pebble's
// group commit, whatever the number of records, and the scan keeps its
// consistent snapshot (no per-record locking, no record moved between
// epochs twice or missed).
//
// Lookup and Claim, under the key lock, may show a lease expiry that Renew
// wrote without a sync before that write is durable. That is accepted: the
// claim itself was synced, and a crash that loses the renewal also ends its
// holder (it runs in this process), so the lease it extended is over anyway.
//
// A read-only store is not written (nothing commits while it is open).
func (e *Engine) syncVisible() error {
	if e.readOnly {
		return nil
	}
	if err := e.pdb.LogData(nil, pebble.Sync); err != nil {
		return fmt.Errorf("receipts: scan: sync the WAL: %w", err)
	}
	return nil
}

// rawRecords iterates every record key in the live epochs (scope-restricted
// if scope is not empty), with its epoch and undecoded value. Everything it
// passes to fn is durable (syncVisible).
func (e *Engine) rawRecords(ctx context.Context, lo uint64, scope string, fn func(epoch uint64, key, value []byte) bool) error {
	it, err := e.pdb.NewIterWithContext(ctx, &pebble.IterOptions{LowerBound: keys.EpochStart(lo), UpperBound: keys.RecordsEnd})
	if err != nil {
		return fmt.Errorf("receipts: scan: %w", err)
	}
	defer it.Close()
	if err := e.syncVisible(); err != nil {
		return err
	}
	var valid bool
	if scope == "" {
		valid = it.First()
	} else {
		valid = it.SeekGE(keys.ScopeStart(lo, scope))
	}
	for i := 0; valid; i++ {
		if i%1024 == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		ep, ok := keys.Epoch(it.Key())
		if !ok {
			return fmt.Errorf("%w: malformed record key %q", driver.ErrCorrupt, it.Key())
		}
		if scope != "" {
			prefix := keys.ScopeStart(ep, scope)
			if !bytes.HasPrefix(it.Key(), prefix) {
				if bytes.Compare(it.Key(), prefix) < 0 {
					valid = it.SeekGE(prefix)
				} else {
					valid = it.SeekGE(keys.ScopeStart(ep+1, scope))
				}
				continue
			}
		}
		v, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("receipts: scan: %w", err)
		}
		if !fn(ep, it.Key(), v) {
			return nil
		}
		valid = it.Next()
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("receipts: scan: %w", err)
	}
	return nil
}

// records yields the decoded visible records of the live epochs.
func (e *Engine) records(ctx context.Context, now int64, scope string) iter.Seq2[driver.Record, error] {
	return func(yield func(driver.Record, error) bool) {
		lo := e.oldestLiveEpoch(e.epochOf(now))
		stopped := false
		err := e.rawRecords(ctx, lo, scope, func(_ uint64, key, value []byte) bool {
			_, s, id, kerr := keys.ParseRecord(key)
			if kerr != nil {
				stopped = !yield(driver.Record{}, fmt.Errorf("%w: record key %q: %w", driver.ErrCorrupt, key, kerr))
				return !stopped
			}
			k := driver.Key{Scope: s, ID: id}
			rec, derr := encoding.DecodeRecord(value)
			if derr != nil {
				stopped = !yield(driver.Record{}, fmt.Errorf("%w: %s: %w", driver.ErrCorrupt, k, derr))
				return !stopped
			}
			if !machine.Visible(rec, now, e.retention) {
				return true
			}
			stopped = !yield(e.record(k, rec), nil)
			return !stopped
		})
		if err != nil && !stopped {
			yield(driver.Record{}, err)
		}
	}
}
