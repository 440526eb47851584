package main

import (
	"bytes"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/spf13/cobra"
)

// verifyReport is what verify found; --json prints it.
type verifyReport struct {
	Dir          string          `json:"dir"`
	OK           bool            `json:"ok"`
	Records      int             `json:"records"` // record keys checked
	Epochs       int             `json:"epochs"`  // distinct epochs holding records
	Expired      int             `json:"expired"` // past the store's retention, waiting for GC
	EpochWidth   string          `json:"epoch_width,omitempty"`
	GCFloor      uint64          `json:"gc_floor"`
	TokenCeiling uint64          `json:"token_ceiling"`
	Problems     []verifyProblem `json:"problems"`
}

// verifyProblem is one thing wrong with one stored key.
type verifyProblem struct {
	// Key is the record's key ("scope"/"id", Go-quoted) or, for a key that
	// does not parse, the raw key, Go-quoted.
	Key     string  `json:"key"`
	Epoch   *uint64 `json:"epoch,omitempty"`
	Problem string  `json:"problem"`
}

func (a *app) verifyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "verify",
		Short: "Check that every record decodes and sits in a valid epoch, and that meta is sane",
		Long: `verify reads every key of a store directory and checks that the meta record,
token ceiling and GC floor decode and are sane; that every record key parses,
sits in an epoch not below the GC floor and at most one epoch ahead of now,
matching the record's last write; that every record decodes (version,
checksum, fields), holds a token below the token ceiling, and that no key is
stored in two epochs. It prints the problems and exits with code 1 if there
are any. It works offline only (it reads the raw keys).`,
		Example: `  receiptctl --dir ./data verify
  receiptctl --dir ./data verify --json | jq '.problems[]'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.needDir("verify"); err != nil {
				return err
			}
			rep := &verifyReport{Dir: a.dir, Problems: []verifyProblem{}}
			db, _, err := a.openStore()
			switch {
			case errors.Is(err, receipts.ErrCorrupt), errors.Is(err, receipts.ErrUnknownFormat):
				// The store refuses to open: that is the finding.
				rep.Problems = append(rep.Problems, verifyProblem{Key: "store", Problem: err.Error()})
			case err != nil:
				return err
			default:
				err = a.verify(db, rep, time.Now())
				if cerr := db.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return err
				}
			}
			rep.OK = len(rep.Problems) == 0
			if a.json {
				if err := writeJSON(a.stdout, rep); err != nil {
					return err
				}
			} else {
				a.printVerify(rep)
			}
			if !rep.OK {
				return errProblems
			}
			return nil
		},
	}
}

// verify checks the raw keys of db into rep.
func (a *app) verify(db *receipts.DB, rep *verifyReport, now time.Time) error {
	pdb := db.Pebble()
	add := func(key string, epoch *uint64, format string, args ...any) {
		rep.Problems = append(rep.Problems, verifyProblem{Key: key, Epoch: epoch, Problem: fmt.Sprintf(format, args...)})
	}
	get := func(k []byte) ([]byte, bool, error) {
		v, closer, err := pdb.Get(k)
		if errors.Is(err, pebble.ErrNotFound) {
			return nil, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("read %q: %w", k, err)
		}
		defer closer.Close()
		return bytes.Clone(v), true, nil
	}

	// Meta, token ceiling, GC floor.
	var width int64
	v, ok, err := get(keys.Meta)
	if err != nil {
		return err
	}
	if !ok {
		add("meta", nil, "no meta record")
	} else if m, err := encoding.DecodeMeta(v); err != nil {
		add("meta", nil, "does not decode: %v", err)
	} else {
		switch {
		case m.Format < encoding.MinStoreFormat || m.Format > encoding.StoreFormat:
			add("meta", nil, "format %d, want %d to %d", m.Format, encoding.MinStoreFormat, encoding.StoreFormat)
		case m.EpochWidth <= 0:
			add("meta", nil, "epoch width %d", m.EpochWidth)
		case m.CreatedAt > now.UnixNano()+m.EpochWidth:
			add("meta", nil, "created in the future (%s)", time.Unix(0, m.CreatedAt))
		default:
			width = m.EpochWidth
			rep.EpochWidth = time.Duration(width).String()
		}
	}
	haveCeiling := false
	if v, ok, err := get(keys.TokenCeiling); err != nil {
		return err
	} else if ok {
		if rep.TokenCeiling, err = encoding.DecodeUint64(v); err != nil {
			add("token ceiling", nil, "does not decode: %v", err)
		} else {
			haveCeiling = true
		}
	}
	if v, ok, err := get(keys.GCFloor); err != nil {
		return err
	} else if ok {
		if rep.GCFloor, err = encoding.DecodeUint64(v); err != nil {
			add("gc floor", nil, "does not decode: %v", err)
		}
	}

	// Every key under the store's prefix.
	it, err := pdb.NewIter(&pebble.IterOptions{LowerBound: keys.StoreStart, UpperBound: keys.StoreEnd})
	if err != nil {
		return err
	}
	defer it.Close()
	p := a.newProgress("verified")
	defer p.done()
	nowEpoch := uint64(0)
	if width > 0 {
		nowEpoch = uint64(now.UnixNano() / width)
	}
	retention := db.Options().Retention.Nanoseconds()
	seed := maphash.MakeSeed()
	seen := make(map[uint64]uint64) // hash of scope/id -> epoch it was first seen in
	lastEpoch, anyEpoch := uint64(0), false
	var rec encoding.Record
	for valid := it.First(); valid; valid = it.Next() {
		key := it.Key()
		switch {
		case bytes.Equal(key, keys.Meta), bytes.Equal(key, keys.TokenCeiling), bytes.Equal(key, keys.GCFloor), bytes.Equal(key, keys.Clock):
			continue
		case bytes.HasPrefix(key, keys.MarkersStart): // a tombstone marker
			if _, _, _, err := keys.ParseMarker(key); err != nil {
				add(strconv.Quote(string(key)), nil, "malformed tombstone marker key")
			} else if v, err := it.ValueAndErr(); err != nil {
				return err
			} else if _, err := encoding.DecodeUint64(v); err != nil {
				add(strconv.Quote(string(key)), nil, "tombstone marker does not decode: %v", err)
			}
			continue
		case !bytes.HasPrefix(key, keys.RecordsStart):
			add(strconv.Quote(string(key)), nil, "unknown key under the store's reserved prefix")
			continue
		}
		rep.Records++
		p.add()
		epoch, scope, id, err := keys.ParseRecord(key)
		if err != nil {
			add(strconv.Quote(string(key)), nil, "malformed record key")
			continue
		}
		if !anyEpoch || epoch != lastEpoch {
			rep.Epochs++
			lastEpoch, anyEpoch = epoch, true
		}
		name := receipts.Key{Scope: scope, ID: id}.String()
		ep := &epoch
		if epoch < rep.GCFloor {
			add(name, ep, "in epoch %d, below the GC floor %d (GC dropped that epoch)", epoch, rep.GCFloor)
		}
		if width > 0 && epoch > nowEpoch+1 {
			add(name, ep, "in epoch %d, more than one epoch ahead of now (epoch %d)", epoch, nowEpoch)
		}
		h := maphash.String(seed, keys.LockKey(scope, id))
		if first, dup := seen[h]; dup {
			other := bytes.Clone(key)
			keys.SetEpoch(other, first)
			// An older copy past retention is harmless (a claim after it
			// expired supersedes it without looking that far back; GC drops
			// it): only two visible copies are a problem.
			if v, ok, err := get(other); err != nil {
				return err
			} else if ok {
				var older encoding.Record
				if encoding.DecodeRecordInto(&older, v) != nil || now.UnixNano() < older.UpdatedAt+retention {
					add(name, ep, "stored twice, also in epoch %d", first)
				}
			}
		} else {
			seen[h] = epoch
		}
		value, err := it.ValueAndErr()
		if err != nil {
			return fmt.Errorf("read %s: %w", name, err)
		}
		if err := encoding.DecodeRecordInto(&rec, value); err != nil {
			add(name, ep, "does not decode: %v", err)
			continue
		}
		if width > 0 {
			if e := uint64(max(rec.UpdatedAt, 0) / width); epoch < e || epoch > max(e, rep.GCFloor) {
				add(name, ep, "last written at %s (epoch %d) but stored in epoch %d", time.Unix(0, rec.UpdatedAt).UTC().Format(time.RFC3339Nano), e, epoch)
			}
		}
		switch {
		case rec.Attempts == 0:
			add(name, ep, "attempts is 0")
		case rec.CreatedAt > rec.UpdatedAt:
			add(name, ep, "created after its last write")
		case rec.State == encoding.StatePending && rec.LeaseExpiresAt == 0:
			add(name, ep, "pending without a lease expiry")
		}
		if !haveCeiling {
			add(name, ep, "token %d, but the store has no token ceiling", rec.Token)
		} else if rec.Token >= rep.TokenCeiling {
			add(name, ep, "token %d not below the token ceiling %d (a restart could hand it out again)", rec.Token, rep.TokenCeiling)
		}
		if rec.UpdatedAt+retention <= now.UnixNano() {
			rep.Expired++
		}
	}
	if err := it.Error(); err != nil {
		return fmt.Errorf("scan: %w", err)
	}
	return nil
}

func (a *app) printVerify(rep *verifyReport) {
	summary := fmt.Sprintf("%d %s in %d %s (epoch width %s, GC floor %d, token ceiling %d, %d expired)",
		rep.Records, plural(rep.Records, "record", "records"), rep.Epochs, plural(rep.Epochs, "epoch", "epochs"),
		rep.EpochWidth, rep.GCFloor, rep.TokenCeiling, rep.Expired)
	if rep.OK {
		fmt.Fprintf(a.stdout, "ok: %s, meta sane\n", summary)
		return
	}
	fmt.Fprintf(a.stdout, "%d %s in %s\n", len(rep.Problems), plural(len(rep.Problems), "problem", "problems"), summary)
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "KEY\tEPOCH\tPROBLEM")
	for _, p := range rep.Problems {
		epoch := "-"
		if p.Epoch != nil {
			epoch = strconv.FormatUint(*p.Epoch, 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Key, epoch, p.Problem)
	}
	_ = tw.Flush()
}
