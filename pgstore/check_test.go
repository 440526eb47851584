package pgstore

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts"
)

// DB.Check on PostgreSQL finds nothing in a sound schema and reports, by key and partition,
// every kind of damage to rows and partitions that the engine never writes itself.
func TestCheckFindsDamagedRows(t *testing.T) {
	leakCheck(t)
	d := newTestDB(t)
	clk := newClock()
	db, pool := d.openDB(Options{Options: receipts.Options{Now: clk.Now, Retention: 8 * time.Hour, EpochWidth: time.Hour}})
	s := pgx.Identifier{d.schema}.Sanitize()
	fp := []byte("fp")
	ids := []string{"attempts", "state", "noresult", "token", "created", "copied", "moved", "fine"}
	for _, id := range ids {
		if _, err := db.Do(bg, receipts.Key{Scope: "s", ID: id}, fp, func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("r"), nil }); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := db.Claim(bg, receipts.Key{Scope: "s", ID: "nolease"}, fp); err != nil {
		t.Fatal(err)
	}
	rep, err := db.Check(bg)
	if err != nil || !rep.OK() || rep.Records != len(ids)+1 || rep.Epochs != 1 || rep.EpochWidth != time.Hour {
		t.Fatalf("a sound schema: %+v %v", rep, err)
	}

	now := clk.Now().UnixMicro() / time.Hour.Microseconds()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(bg, strings.ReplaceAll(sql, "S.", s+"."), args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	for _, ep := range []int64{now - 1, now + 3} {
		exec(fmt.Sprintf(`CREATE TABLE S.records_e%d PARTITION OF S.records FOR VALUES FROM (%d) TO (%d)`, ep, ep, ep+1))
	}
	exec(`UPDATE S.records SET attempts = 0 WHERE id = 'attempts'`)
	exec(`UPDATE S.records SET state = 7 WHERE id = 'state'`)
	exec(`UPDATE S.records SET result = NULL WHERE id = 'noresult'`)
	exec(`UPDATE S.records SET lease_expires_at = NULL WHERE id = 'nolease'`)
	exec(`UPDATE S.records SET token = 1099511627776 WHERE id = 'token'`)
	exec(`UPDATE S.records SET created_at = updated_at + interval '1 second' WHERE id = 'created'`)
	exec(`UPDATE S.records SET epoch = epoch + 3 WHERE id = 'moved'`)
	exec(`INSERT INTO S.records SELECT scope, id, epoch - 1, state, fp, token, attempts, nonce, created_at - interval '1 hour',
       updated_at - interval '1 hour', lease_expires_at, result FROM S.records WHERE id = 'copied'`)

	rep, err = db.Check(bg)
	if err != nil {
		t.Fatal(err)
	}
	type at struct {
		key   string
		epoch int64
	}
	got := map[at][]string{}
	for _, p := range rep.Problems {
		got[at{p.Key, p.Epoch}] = append(got[at{p.Key, p.Epoch}], p.What)
	}
	want := map[at][]string{
		{`"s"/"attempts"`, now}:   {"attempts is 0"},
		{`"s"/"state"`, now}:      {"unknown state 7"},
		{`"s"/"noresult"`, now}:   {"finished without a result"},
		{`"s"/"nolease"`, now}:    {"pending without a lease expiry"},
		{`"s"/"token"`, now}:      {"not issued by the token sequence"},
		{`"s"/"created"`, now}:    {"created after its last write"},
		{`"s"/"moved"`, now + 3}:  {"last written at", "more than one epoch ahead of now"},
		{`"s"/"copied"`, now - 1}: {"stored twice, also in epoch"},
	}
	if len(got) != len(want) {
		t.Fatalf("problems: %+v", rep.Problems)
	}
	for a, whats := range want {
		if len(got[a]) != len(whats) {
			t.Fatalf("%v: %v; all: %+v", a, got[a], rep.Problems)
		}
		for i, w := range whats {
			if !strings.Contains(got[a][i], w) {
				t.Errorf("%v: %q, want %q", a, got[a][i], w)
			}
		}
	}
	if rep.Records != len(ids)+2 || rep.Epochs != 3 {
		t.Errorf("records %d in %d epochs, want %d in 3", rep.Records, rep.Epochs, len(ids)+2)
	}

	// A partition detached while its records are within retention: reads no longer see them.
	exec(fmt.Sprintf(`ALTER TABLE S.records DETACH PARTITION S.records_e%d`, now-1))
	rep, err = db.Check(bg)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range rep.Problems {
		if p.Key == fmt.Sprintf("records_e%d", now-1) && p.Epoch == now-1 && strings.Contains(p.What, "detached") {
			found = true
		}
	}
	if !found {
		t.Fatalf("a detached live partition: %+v", rep.Problems)
	}
	// A meta row that is not sane: an epoch width that is not positive.
	exec(`UPDATE S.meta SET epoch_width_us = 0`)
	rep, err = db.Check(bg)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Problems[0].Key != "meta" || !strings.Contains(rep.Problems[0].What, "epoch width 0") || rep.EpochWidth != 0 {
		t.Fatalf("bad meta: %+v", rep)
	}
}
