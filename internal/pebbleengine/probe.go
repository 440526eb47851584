package pebbleengine

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"
)

// probeOpts are the iterator options of a prober: L6's Bloom filters on.
var probeOpts = pebble.IterOptions{UseL6Filters: true}

// A prober reads keys that are often absent: a claim's probes of the live
// epochs for a new key, the probes of older epochs' markers, and a cached
// retry's probes of the epochs newer than its record's.
//
// Pebble's Get never reads the Bloom filters of the bottom level (L6): it
// expects the key to be there. So once a store's records have been
// compacted to L6, every absent key cost a Get the read and search of an
// L6 index block and data block: 8.9–12.3 µs per probe in a store of 1M
// keys, against 1.5–1.6 µs through an iterator with UseL6Filters, which
// answers most absent keys from the filter (bench/: BenchmarkAbsentProbe;
// a present key costs 0.3–0.5 µs more that way, so reads that expect to
// find their key keep Get). One iterator serves every probe of one read:
// one snapshot for all of them.
//
// Set db; close the prober when done.
type prober struct {
	db *pebble.DB
	it *pebble.Iterator
}

// get returns key's value, valid until the next get or close, and whether
// key is present.
func (p *prober) get(key []byte) ([]byte, bool, error) {
	if p.it == nil {
		it, err := p.db.NewIter(&probeOpts)
		if err != nil {
			return nil, false, err
		}
		p.it = it
	}
	if !p.it.SeekPrefixGE(key) || !bytes.Equal(p.it.Key(), key) {
		return nil, false, p.it.Error()
	}
	v, err := p.it.ValueAndErr()
	return v, err == nil, err
}

// close releases the iterator.
func (p *prober) close() error {
	if p.it == nil {
		return nil
	}
	err := p.it.Close()
	p.it = nil
	return err
}

// closeInto closes p, for a defer: a failure to close becomes *err, as
// "receipts: <what>: <cause>", unless *err holds an earlier error.
func (p *prober) closeInto(err *error, what string) {
	if cerr := p.close(); cerr != nil && *err == nil {
		*err = fmt.Errorf("receipts: %s: %w", what, cerr)
	}
}
