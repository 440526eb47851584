package bench

import (
	"bytes"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/receiptstore/receipts/bench/internal/stores"
)

var probeKeys = flag.String("probekeys", "20000,200000", "BenchmarkAbsentProbe: store sizes, comma-separated (the README's figures add 1000000)")

// BenchmarkAbsentProbe is the probe a first call makes for its new key, in a store of n
// keys flushed and compacted into L6, with the new key inside the stored key range:
// Pebble's DB.Get (what the floor does; it never reads L6's Bloom filters) against an
// iterator with UseL6Filters and SeekPrefixGE (what the engine does,
// internal/pebbleengine/probe.go). present: the same for keys that are there.
func BenchmarkAbsentProbe(b *testing.B) {
	for _, f := range strings.Split(*probeKeys, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			b.Fatalf("bad -probekeys entry %q", f)
		}
		b.Run(fmt.Sprintf("keys=%d", n), func(b *testing.B) {
			db := probeStore(b, n)
			for _, present := range []bool{false, true} {
				key := func(i int) []byte {
					j := uint64(i%n)*2 + 1 // absent: odd
					if present {
						j--
					}
					return probeKey(j)
				}
				kind := "absent"
				if present {
					kind = "present"
				}
				b.Run(kind+"/get", func(b *testing.B) {
					for i := 0; b.Loop(); i++ {
						_, c, err := db.Get(key(i * 7919))
						if err == nil {
							_ = c.Close()
						} else if err != pebble.ErrNotFound {
							b.Fatal(err)
						}
					}
				})
				b.Run(kind+"/iter-l6-filters", func(b *testing.B) {
					opts := &pebble.IterOptions{UseL6Filters: true}
					for i := 0; b.Loop(); i++ {
						k := key(i * 7919)
						it, err := db.NewIter(opts)
						if err != nil {
							b.Fatal(err)
						}
						if it.SeekPrefixGE(k) && !bytes.Equal(it.Key(), k) {
							b.Fatal("SeekPrefixGE found another key")
						}
						if err := it.Close(); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

// probeKey is the j-th key of the probe store: laid out like a record key, spread over
// the key space.
func probeKey(j uint64) []byte {
	return fmt.Appendf(nil, "\x00rcptr\x00\x00\x00\x00\x00\x00\x00\x01\x08tenant-1op-%016x", j*0x9E3779B97F4A7C15)
}

// probeStore opens a Pebble store (on disk, or on memory with -memfs) holding the even
// keys 0, 2, .., 2n-2 with 120-byte values, flushed and compacted.
func probeStore(b *testing.B, n int) *pebble.DB {
	b.Helper()
	opts := stores.PebbleOptions()
	if *memFS {
		opts.FS = vfs.NewMem()
	}
	db, err := pebble.Open(b.TempDir(), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	val := bytes.Repeat([]byte("v"), 120)
	batch := db.NewBatch()
	for i := range n {
		if err := batch.Set(probeKey(uint64(i)*2), val, nil); err != nil {
			b.Fatal(err)
		}
		if batch.Len() > 1<<20 || i == n-1 {
			if err := batch.Commit(pebble.NoSync); err != nil {
				b.Fatal(err)
			}
			batch = db.NewBatch()
		}
	}
	if err := stores.SettlePebble(db); err != nil {
		b.Fatal(err)
	}
	if m := db.Metrics(); m.Levels[6].TablesCount == 0 {
		b.Fatal("no table in L6 after compacting")
	}
	return db
}
