package pgstore

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
)

// The schema is created once; a later open reads the stored epoch width and secret; a
// format this code does not know is refused and left alone.
func TestSchemaCreateReopenRefuse(t *testing.T) {
	d := newTestDB(t)
	a := d.open(engineOptions{Retention: 8 * time.Hour})
	b := d.open(engineOptions{Retention: 4 * time.Hour, EpochWidth: time.Minute})
	if b.width != a.width || b.width != (2*time.Hour).Microseconds() {
		t.Fatalf("width %d vs %d", b.width, a.width)
	}
	if len(a.Secret()) != 32 || !bytes.Equal(a.Secret(), b.Secret()) {
		t.Fatal("secret not shared")
	}
	var ret int64
	if err := a.pool.QueryRow(bg, `SELECT retention_us FROM `+a.q.schema+`.meta`).Scan(&ret); err != nil || ret != (4*time.Hour).Microseconds() {
		t.Fatalf("retention in meta %d %v", ret, err)
	}
	if _, err := a.pool.Exec(bg, `UPDATE `+a.q.schema+`.meta SET format = 99`); err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.New(bg, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	_, err = newEngine(bg, pool, engineOptions{Schema: d.schema})
	if !errors.Is(err, receipts.ErrUnknownFormat) {
		t.Fatalf("open of format 99: %v", err)
	}
	var f int
	if err := pool.QueryRow(bg, `SELECT format FROM `+a.q.schema+`.meta`).Scan(&f); err != nil || f != 99 {
		t.Fatalf("format changed: %d %v", f, err)
	}
}

func TestBadOptions(t *testing.T) {
	pool, err := pgxpool.New(bg, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	for _, o := range []engineOptions{
		{Schema: "Bad-Name"},
		{Schema: "x; DROP TABLE y"},
		{Retention: -time.Second},
		{EpochWidth: 500 * time.Nanosecond}, // widths are stored in µs
	} {
		ctx, cancel := context.WithTimeout(bg, 10*time.Second)
		_, err := newEngine(ctx, pool, o)
		cancel()
		if !errors.Is(err, receipts.ErrInvalidOptions) {
			t.Errorf("%+v: %v", o, err)
		}
	}
	if _, err := newEngine(bg, nil, engineOptions{}); !errors.Is(err, receipts.ErrInvalidOptions) {
		t.Errorf("nil pool: %v", err)
	}
}

// Nodes opening a fresh schema at the same moment create it once and share it.
func TestSchemaConcurrentFirstOpen(t *testing.T) {
	d := newTestDB(t)
	pool, err := pgxpool.New(bg, d.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const n = 6
	engines := make([]*engine, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			engines[i], errs[i] = newEngine(bg, pool, engineOptions{Schema: d.schema})
		}()
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("open %d: %v", i, errs[i])
		}
		defer engines[i].Close()
		if !bytes.Equal(engines[i].Secret(), engines[0].Secret()) {
			t.Fatal("two secrets")
		}
	}
}
