package pebbleengine

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/internal/machine"
	"github.com/receiptstore/receipts/internal/progress"
)

var _ driver.Checker = (*Engine)(nil)

// Check implements driver.Checker. From one snapshot it checks that the
// meta record, token ceiling and GC floor decode and are sane; that every
// key under the store's prefix is one the store writes; that every record
// key parses, sits in an epoch not below the GC floor, at most one epoch
// ahead of now and matching the record's last write; that every record
// decodes (version, checksum, fields), is consistent (attempts, times, a
// pending record's lease) and holds a token below the token ceiling; and
// that no key is visible in two epochs.
func (e *Engine) Check(ctx context.Context) (driver.CheckReport, error) {
	rep := driver.CheckReport{Problems: []driver.Problem{}}
	snap := e.pdb.NewSnapshot()
	defer snap.Close()
	if err := e.syncVisible(); err != nil { // report nothing a crash can take away
		return rep, err
	}
	c := checker{ctx: ctx, e: e, snap: snap, rep: &rep, now: e.now(), clock: machine.ClockNanos(e.cfg.Now()),
		seed: maphash.MakeSeed(), seen: map[uint64]uint64{}}
	if err := c.meta(); err != nil {
		return rep, err
	}
	if err := c.records(); err != nil {
		return rep, err
	}
	return rep, nil
}

// checker is one Check's state.
type checker struct {
	ctx  context.Context
	e    *Engine
	snap *pebble.Snapshot
	rep  *driver.CheckReport
	// now is the store's time (what reads judge expiry by); clock is
	// Config.Now itself, which the store's time does not hold back: a
	// record in a future epoch moves the store's time forward on Open.
	now, clock int64

	width       int64 // the meta's epoch width, 0 if unreadable
	haveCeiling bool
	seed        maphash.Seed
	seen        map[uint64]uint64 // hash of scope/id -> the epoch it was first seen in
}

func (c *checker) add(key string, epoch int64, format string, args ...any) {
	c.rep.Problems = append(c.rep.Problems, driver.Problem{Key: key, Epoch: epoch, What: fmt.Sprintf(format, args...)})
}

// get reads key from the snapshot (a copy of its value).
func (c *checker) get(key []byte) ([]byte, bool, error) {
	v, closer, err := c.snap.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("receipts: check: read %q: %w", key, err)
	}
	defer closer.Close()
	return bytes.Clone(v), true, nil
}

// meta checks the meta record, the token ceiling and the GC floor.
func (c *checker) meta() error {
	v, ok, err := c.get(keys.Meta)
	if err != nil {
		return err
	}
	if !ok {
		c.add("meta", -1, "no meta record")
	} else if m, err := encoding.DecodeMeta(v); err != nil {
		c.add("meta", -1, "does not decode: %v", err)
	} else {
		switch {
		case m.Format < encoding.MinStoreFormat || m.Format > encoding.StoreFormat:
			c.add("meta", -1, "format %d, want %d to %d", m.Format, encoding.MinStoreFormat, encoding.StoreFormat)
		case m.EpochWidth <= 0:
			c.add("meta", -1, "epoch width %d", m.EpochWidth)
		case m.CreatedAt > c.clock+m.EpochWidth:
			c.add("meta", -1, "created in the future (%s)", time.Unix(0, m.CreatedAt).UTC())
		default:
			c.width = m.EpochWidth
			c.rep.EpochWidth = time.Duration(m.EpochWidth)
		}
	}
	if v, ok, err := c.get(keys.TokenCeiling); err != nil {
		return err
	} else if ok {
		if c.rep.TokenCeiling, err = encoding.DecodeUint64(v); err != nil {
			c.add("token ceiling", -1, "does not decode: %v", err)
		} else {
			c.haveCeiling = true
		}
	}
	if v, ok, err := c.get(keys.GCFloor); err != nil {
		return err
	} else if ok {
		if c.rep.GCFloor, err = encoding.DecodeUint64(v); err != nil {
			c.add("gc floor", -1, "does not decode: %v", err)
		}
	}
	return nil
}

// records checks every key under the store's prefix.
func (c *checker) records() error {
	it, err := c.snap.NewIterWithContext(c.ctx, &pebble.IterOptions{LowerBound: keys.StoreStart, UpperBound: keys.StoreEnd})
	if err != nil {
		return fmt.Errorf("receipts: check: %w", err)
	}
	defer it.Close()
	nowEpoch := uint64(0)
	if c.width > 0 {
		nowEpoch = uint64(max(c.clock, 0) / c.width)
	}
	lastEpoch, anyEpoch := uint64(0), false
	var rec encoding.Record
	report := progress.From(c.ctx)
	for valid := it.First(); valid; valid = it.Next() {
		if c.rep.Records%1024 == 0 {
			if err := c.ctx.Err(); err != nil {
				return err
			}
			if report != nil {
				report(c.rep.Records)
			}
		}
		key := it.Key()
		switch {
		case bytes.Equal(key, keys.Meta), bytes.Equal(key, keys.TokenCeiling), bytes.Equal(key, keys.GCFloor), bytes.Equal(key, keys.Clock):
			continue
		case bytes.HasPrefix(key, keys.MarkersStart): // a tombstone marker
			if _, _, _, err := keys.ParseMarker(key); err != nil {
				c.add(strconv.Quote(string(key)), -1, "malformed tombstone marker key")
			} else if v, err := it.ValueAndErr(); err != nil {
				return fmt.Errorf("receipts: check: read a tombstone marker: %w", err)
			} else if _, err := encoding.DecodeUint64(v); err != nil {
				c.add(strconv.Quote(string(key)), -1, "tombstone marker does not decode: %v", err)
			}
			continue
		case bytes.HasPrefix(key, keys.SettingsStart): // a setting of the root's (privacy.go): opaque
			continue
		case bytes.HasPrefix(key, keys.DataKeysStart): // a scope's data key (privacy.go): opaque
			if len(key) != len(keys.DataKeysStart)+driver.ScopeIDLen {
				c.add(strconv.Quote(string(key)), -1, "malformed data key key")
			}
			continue
		case bytes.HasPrefix(key, keys.ErasuresStart): // an erasure record
			if v, err := it.ValueAndErr(); err != nil {
				return fmt.Errorf("receipts: check: read an erasure record: %w", err)
			} else if _, err := decodeErasure(key[len(keys.ErasuresStart):], v); err != nil || len(key) != len(keys.ErasuresStart)+driver.ScopeIDLen {
				c.add(strconv.Quote(string(key)), -1, "erasure record does not decode: %v", err)
			}
			continue
		case !bytes.HasPrefix(key, keys.RecordsStart):
			c.add(strconv.Quote(string(key)), -1, "unknown key under the store's reserved prefix")
			continue
		}
		c.rep.Records++
		epoch, scope, id, err := keys.ParseRecord(key)
		if err != nil {
			c.add(strconv.Quote(string(key)), -1, "malformed record key")
			continue
		}
		if !anyEpoch || epoch != lastEpoch {
			c.rep.Epochs++
			lastEpoch, anyEpoch = epoch, true
		}
		name := driver.Key{Scope: scope, ID: id}.String()
		ep := int64(epoch)
		if epoch < c.rep.GCFloor {
			c.add(name, ep, "in epoch %d, below the GC floor %d (GC dropped that epoch)", epoch, c.rep.GCFloor)
		}
		if c.width > 0 && epoch > nowEpoch+1 {
			c.add(name, ep, "in epoch %d, more than one epoch ahead of now (epoch %d)", epoch, nowEpoch)
		}
		if err := c.twice(name, key, epoch, scope, id); err != nil {
			return err
		}
		value, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("receipts: check: read %s: %w", name, err)
		}
		if err := encoding.DecodeRecordInto(&rec, value); err != nil {
			c.add(name, ep, "does not decode: %v", err)
			continue
		}
		c.record(name, epoch, &rec)
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("receipts: check: %w", err)
	}
	return nil
}

// twice reports a key stored in an earlier epoch too, if that copy is
// still visible. An older copy past retention is harmless (a claim after
// it expired supersedes it without looking that far back; GC drops it).
func (c *checker) twice(name string, key []byte, epoch uint64, scope, id string) error {
	h := maphash.String(c.seed, keys.LockKey(scope, id))
	first, dup := c.seen[h]
	if !dup {
		c.seen[h] = epoch
		return nil
	}
	other := bytes.Clone(key)
	keys.SetEpoch(other, first)
	v, ok, err := c.get(other)
	if err != nil || !ok { // !ok: a hash collision
		return err
	}
	var older encoding.Record
	if encoding.DecodeRecordInto(&older, v) != nil || c.now < older.UpdatedAt+c.e.retention {
		c.add(name, int64(epoch), "stored twice, also in epoch %d", first)
	}
	return nil
}

// record checks a decoded record stored in epoch.
func (c *checker) record(name string, epoch uint64, rec *encoding.Record) {
	ep := int64(epoch)
	if c.width > 0 {
		if want := uint64(max(rec.UpdatedAt, 0) / c.width); epoch < want || epoch > max(want, c.rep.GCFloor) {
			c.add(name, ep, "last written at %s (epoch %d) but stored in epoch %d",
				time.Unix(0, rec.UpdatedAt).UTC().Format(time.RFC3339Nano), want, epoch)
		}
	}
	switch {
	case rec.Attempts == 0:
		c.add(name, ep, "attempts is 0")
	case rec.CreatedAt > rec.UpdatedAt:
		c.add(name, ep, "created after its last write")
	case rec.State == encoding.StatePending && rec.LeaseExpiresAt == 0:
		c.add(name, ep, "pending without a lease expiry")
	}
	if !c.haveCeiling {
		c.add(name, ep, "token %d, but the store has no token ceiling", rec.Token)
	} else if rec.Token >= c.rep.TokenCeiling {
		c.add(name, ep, "token %d not below the token ceiling %d (a restart could hand it out again)", rec.Token, c.rep.TokenCeiling)
	}
	if rec.UpdatedAt+c.e.retention <= c.now {
		c.rep.Expired++
	}
}
