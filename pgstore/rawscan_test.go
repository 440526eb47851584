package pgstore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/pgtest"
)

// TestReadRecordAsScan: readRecord, which decodes a record's binary columns itself, reads
// every row as scanRecord reads it through pgx's Scan (the same record, time, extras and
// error), on the real server; and it decodes them itself only where the row is in binary
// (the extended protocol), falling back to Scan for the simple protocol's text.
func TestReadRecordAsScan(t *testing.T) {
	dsn, _ := pgtest.Schema(t)
	ctx := context.Background()
	const shape = `SELECT $1::smallint, $2::bytea, $3::bigint, $4::int, $5::timestamptz, $6::timestamptz, $7::timestamptz,
  $8::bytea, $9::bytea, $10::timestamptz, $11::bool, $12::text, $13::bigint, $14::bytea`
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	now := at("2026-12-07T15:04:05.123456Z")
	type row = []any
	cases := map[string]row{
		"finished":          {int16(driver.Succeeded), []byte("fp"), int64(1) << 40, int32(3), at("2026-12-07T15:00:00.000001Z"), now, nil, []byte("result"), []byte("00-trace"), now, true, "123", int64(7), []byte("journal")},
		"pending":           {int16(driver.Pending), []byte("fp"), int64(9), int32(1), now, now, at("2026-12-07T15:05:00Z"), nil, nil, now, false, "", int64(-1), nil},
		"empty byteas":      {int16(driver.Failed), []byte{}, int64(-5), int32(-1), now, now, nil, []byte{}, []byte{}, now, true, "x", int64(0), []byte{}},
		"before 2000":       {int16(driver.Succeeded), []byte("fp"), int64(1), int32(1), at("1969-07-20T20:17:40.999999Z"), at("1999-12-31T23:59:59.000001Z"), at("1900-01-01T00:00:00Z"), nil, nil, at("1999-12-31T23:59:59.5Z"), true, "y", int64(1), nil},
		"absent":            {nil, nil, nil, nil, nil, nil, nil, nil, nil, now, false, "z", int64(2), nil},
		"infinite created":  {int16(driver.Succeeded), []byte("fp"), int64(1), int32(1), pgInfinity, now, nil, nil, nil, now, true, "", int64(1), nil},
		"infinite lease":    {int16(driver.Pending), []byte("fp"), int64(1), int32(1), now, now, pgInfinity, nil, nil, now, true, "", int64(1), nil},
		"a NULL time":       {int16(driver.Succeeded), []byte("fp"), int64(1), int32(1), now, now, nil, nil, nil, nil, true, "", int64(1), nil},
		"a NULL extra bool": {int16(driver.Succeeded), []byte("fp"), int64(1), int32(1), now, now, nil, nil, nil, now, nil, "", int64(1), nil},
	}
	type got struct {
		Rec     driver.Record
		Now     time.Time
		Claimed bool
		Xid     string
		I       int64
		Journal []byte
		Err     string
		Absent  bool
	}
	// read keeps what a caller reads of the answer: the record, time and extras, unless the
	// error is not errAbsent, in which case only that it failed, and whether as ErrCorrupt.
	read := func(res *got, err error) {
		switch {
		case errors.Is(err, errAbsent):
			res.Absent = true
		case errors.Is(err, driver.ErrCorrupt):
			*res = got{Err: "corrupt"}
		case err != nil:
			*res = got{Err: "failed"}
		}
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeSimpleProtocol} {
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			t.Fatal(err)
		}
		cfg.DefaultQueryExecMode = mode
		conn, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = conn.Close(ctx) })
		for name, args := range cases {
			var scanned, decoded got
			read(&scanned, scanRecord(conn.QueryRow(ctx, shape, args...), &scanned.Rec, &scanned.Now, &scanned.Claimed, &scanned.Xid, &scanned.I, &scanned.Journal))
			read(&decoded, queryRecord(ctx, conn, shape, args, &decoded.Rec, &decoded.Now, &decoded.Claimed, &decoded.Xid, &decoded.I, &decoded.Journal))
			// another row through the same connection's buffers: what was read must be a copy
			if _, err := conn.Exec(ctx, `SELECT repeat('x', 64)::bytea, repeat('y', 64)::bytea, repeat('z', 64)::bytea`); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(scanned, decoded); d != "" {
				t.Errorf("%v, %s: readRecord differs from Scan (-Scan +readRecord):\n%s", mode, name, d)
			}
			if want := map[string]string{"infinite created": "corrupt", "infinite lease": "corrupt", "a NULL time": "failed", "a NULL extra bool": "failed"}[name]; decoded.Err != want {
				t.Errorf("%v, %s: readRecord's error %q, want %q", mode, name, decoded.Err, want)
			}
			// the NULL claimed flag of a batch's lock rows: into a **bool, nil
			var flag *bool = new(bool)
			var rec driver.Record
			var tm time.Time
			err := queryRecord(ctx, conn, shape, args, &rec, &tm, &flag, new(string), new(int64), new([]byte))
			if err == nil && (flag == nil) != (args[10] == nil) {
				t.Errorf("%v, %s: the **bool extra is %v for %v", mode, name, flag, args[10])
			}
		}
		// the path taken: decoded where the row is binary, Scan's otherwise
		rows, err := conn.Query(ctx, shape, cases["finished"]...)
		if err != nil {
			t.Fatal(err)
		}
		raw := rawShape(rows.FieldDescriptions(), []any{new(bool), new(string), new(int64), new([]byte)})
		rows.Close()
		if want := mode != pgx.QueryExecModeSimpleProtocol; raw != want {
			t.Errorf("%v: decoded itself: %t, want %t", mode, raw, want)
		}
	}
}

// pgInfinity is a timestamptz argument of 'infinity'.
var pgInfinity = pgtype.Timestamptz{InfinityModifier: pgtype.Infinity, Valid: true}
