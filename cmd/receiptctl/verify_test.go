package main

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/keys"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/stretchr/testify/require"
)

// recordKey returns the stored key of scope/id in db.
func recordKey(t *testing.T, db *receipts.DB, scope, id string) []byte {
	t.Helper()
	it, err := pebblestore.DB(db).NewIter(&pebble.IterOptions{LowerBound: keys.RecordsStart, UpperBound: keys.RecordsEnd})
	require.NoError(t, err)
	defer it.Close()
	for valid := it.First(); valid; valid = it.Next() {
		_, s, i, err := keys.ParseRecord(it.Key())
		require.NoError(t, err)
		if s == scope && i == id {
			return bytes.Clone(it.Key())
		}
	}
	t.Fatalf("no record key for %s/%s", scope, id)
	return nil
}

func TestVerify(t *testing.T) {
	dir := newFixture(t)
	r := cli(t, "--dir", dir, "verify").requireCode(t, exitOK)
	require.Regexp(t, `^ok: 6 records in 1 epoch \(epoch width 6h0m0s, GC floor 0, token ceiling \d+, 0 expired\), meta sane\n$`, r.out)
	r = cli(t, "verify", "--dir", dir, "--json").requireCode(t, exitOK)
	var rep verifyReport
	require.NoError(t, json.Unmarshal([]byte(r.out), &rep))
	require.True(t, rep.OK)
	require.Equal(t, 6, rep.Records)
	require.Empty(t, rep.Problems)

	// Break it on purpose: garbage under a record key, a copy of a record
	// three epochs in the future, a token above the ceiling, and a stray
	// key under the store's prefix.
	db, err := receipts.Open(dir, &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	p := pebblestore.DB(db)
	require.NoError(t, p.Set(recordKey(t, db, "acct_1", "op-ok"), []byte("garbage"), pebble.Sync))
	future := recordKey(t, db, "acct_1", "op-bin")
	v, closer, err := p.Get(future)
	require.NoError(t, err)
	v = bytes.Clone(v)
	require.NoError(t, closer.Close())
	width := int64(6 * time.Hour)
	now := uint64(time.Now().UnixNano() / width)
	keys.SetEpoch(future, now+3)
	require.NoError(t, p.Set(future, v, pebble.Sync))
	require.NoError(t, p.Set([]byte(keys.Prefix+"zz"), []byte("?"), pebble.Sync))
	require.NoError(t, db.Close())

	r = cli(t, "--dir", dir, "verify").requireCode(t, exitProblem)
	require.Regexp(t, `(?m)^"acct_1"/"op-ok"\s+\d+\s+does not decode: .*corrupt`, r.out)
	require.Regexp(t, `(?m)^"acct_1"/"op-bin"\s+\d+\s+in epoch \d+, more than one epoch ahead`, r.out)
	require.Regexp(t, `(?m)^"acct_1"/"op-bin"\s+\d+\s+stored twice`, r.out)
	require.Contains(t, r.out, "unknown key under the store's reserved prefix")
	require.Regexp(t, `(?m)^KEY\s+EPOCH\s+PROBLEM$`, r.out)

	r = cli(t, "--dir", dir, "verify", "--json").requireCode(t, exitProblem)
	rep = verifyReport{}
	require.NoError(t, json.Unmarshal([]byte(r.out), &rep))
	require.False(t, rep.OK)
	require.Equal(t, 7, rep.Records)
	require.Equal(t, 2, rep.Epochs)
	var decode []verifyProblem
	for _, p := range rep.Problems {
		if p.Key == `"acct_1"/"op-ok"` {
			decode = append(decode, p)
		}
	}
	require.Len(t, decode, 1)
	require.Contains(t, decode[0].Problem, "does not decode")
	require.NotNil(t, decode[0].Epoch)
	require.Equal(t, now, *decode[0].Epoch)

	// The other commands report the corrupt record and exit 1.
	r = cli(t, "--dir", dir, "ls").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "problem: ")
	require.Contains(t, r.stderr, `"acct_1"/"op-ok"`)
	require.Contains(t, r.out, "op-bin")
	r = cli(t, "--dir", dir, "export").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "could not be read")
	r = cli(t, "--dir", dir, "stats").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "1 corrupt record")
	r = cli(t, "--dir", dir, "get", "acct_1", "op-ok").requireCode(t, exitProblem)
	require.Contains(t, r.stderr, "corrupt")
}

func TestVerifyCorruptMeta(t *testing.T) {
	dir := newFixture(t)
	db, err := receipts.Open(dir, &receipts.Options{GCInterval: -1})
	require.NoError(t, err)
	require.NoError(t, pebblestore.DB(db).Set(keys.Meta, []byte("R\x01garbage-garbage"), pebble.Sync))
	require.NoError(t, db.Close())

	r := cli(t, "--dir", dir, "verify").requireCode(t, exitProblem)
	require.Regexp(t, `(?m)^store\s+-\s+receipts: corrupt record: meta`, r.out)
}
