package pgstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/internal/mutate"
)

// Reading a record without pgx's scan machinery.
//
// pgx's Scan plans a conversion for every column of every row it scans (a row from QueryRow
// is a Rows of its own, so nothing is kept between calls), boxes each destination and
// allocates for each timestamp: 13 of a replay's 34 allocations, and 84-99 against 76-79 µs
// of a replay's client CPU (BenchmarkDBReplay; docs/performance.md). The columns'
// types are fixed by the schema, and with the extended protocol pgx asks for them in binary,
// so readRecord decodes them itself: big-endian integers, bytea as it is, timestamptz as
// microseconds since 2000-01-01. A row in any other shape (a text format, as the simple
// protocol returns, or other types) goes through pgx's Scan as before.

// recOIDs are the types of recCols and the statement's time after them.
var recOIDs = [10]uint32{pgtype.Int2OID, pgtype.ByteaOID, pgtype.Int8OID, pgtype.Int4OID, pgtype.TimestamptzOID,
	pgtype.TimestamptzOID, pgtype.TimestamptzOID, pgtype.ByteaOID, pgtype.ByteaOID, pgtype.TimestamptzOID}

// queryRecord sends sql with args on q and reads the one row it returns as scanRecord reads a
// pgx.Row (no row: pgx.ErrNoRows).
func queryRecord(ctx context.Context, q querier, sql string, args []any, r *driver.Record, now *time.Time, extra ...any) error {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	return readRecord(rows, r, now, extra...)
}

// batchRecord reads the one row of br's next statement as queryRecord does.
func batchRecord(br pgx.BatchResults, r *driver.Record, now *time.Time, extra ...any) error {
	rows, err := br.Query()
	if err != nil {
		return err
	}
	return readRecord(rows, r, now, extra...)
}

// readRecord reads the one row rows returns as scanRecord reads a pgx.Row (no row:
// pgx.ErrNoRows), and closes rows.
func readRecord(rows pgx.Rows, r *driver.Record, now *time.Time, extra ...any) error {
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := scanRow(rows, r, now, extra...); err != nil {
		return err
	}
	rows.Close()
	return rows.Err()
}

// scanRow is scanRecord on rows' current row: decoded from its binary values when the row has
// the shape decodeRecord knows, through pgx's Scan otherwise.
func scanRow(rows pgx.Rows, r *driver.Record, now *time.Time, extra ...any) error {
	vals := rows.RawValues()
	if !rawShape(rows.FieldDescriptions(), extra) || len(vals) != len(recOIDs)+len(extra) {
		return scanRecord(rows, r, now, extra...)
	}
	err := decodeRecord(vals, r, now)
	if err != nil && !errors.Is(err, errAbsent) {
		return err
	}
	for i, x := range extra { // read for an absent record too, as Scan reads every column
		if xerr := decodeExtra(vals[len(recOIDs)+i], x); xerr != nil {
			return xerr
		}
	}
	return err
}

// rawShape reports whether rows described by fds are recCols, the time and columns that
// extra's destinations take, all binary (text in either format): what decodeRecord and
// decodeExtra read.
func rawShape(fds []pgconn.FieldDescription, extra []any) bool {
	if len(fds) != len(recOIDs)+len(extra) {
		return false
	}
	for i, fd := range fds {
		text := fd.DataTypeOID == pgtype.TextOID // text's two formats are the same bytes (pgx asks for text)
		if fd.Format != pgtype.BinaryFormatCode && !text || i < len(recOIDs) && fd.DataTypeOID != recOIDs[i] ||
			i >= len(recOIDs) && !rawExtra(fd.DataTypeOID, extra[i-len(recOIDs)]) {
			return false
		}
	}
	return true
}

// rawExtra reports whether decodeExtra reads a column of type oid into dst.
func rawExtra(oid uint32, dst any) bool {
	switch dst.(type) {
	case *bool, **bool:
		return oid == pgtype.BoolOID
	case *string:
		return oid == pgtype.TextOID
	case *int64:
		return oid == pgtype.Int8OID
	case *[]byte:
		return oid == pgtype.ByteaOID
	}
	return false
}

// decodeExtra reads v, binary, into dst (as rawExtra allowed), as pgx's Scan would: NULL is an
// error except into a []byte or a *bool, which it leaves nil.
func decodeExtra(v []byte, dst any) error {
	switch d := dst.(type) {
	case *[]byte:
		*d = cloneBytea(v)
		return nil
	case **bool:
		if v == nil {
			*d = nil
			return nil
		}
		b := new(bool)
		*d = b
		dst = b
	}
	if v == nil {
		return fmt.Errorf("pgstore: a NULL column read into %T", dst)
	}
	switch d := dst.(type) {
	case *bool:
		if len(v) != 1 {
			return fmt.Errorf("%w: pgstore: a bool of %d bytes", driver.ErrCorrupt, len(v))
		}
		*d = v[0] == 1
	case *string:
		*d = string(v)
	case *int64:
		if len(v) != 8 {
			return fmt.Errorf("%w: pgstore: a bigint of %d bytes", driver.ErrCorrupt, len(v))
		}
		*d = int64(binary.BigEndian.Uint64(v))
	}
	return nil
}

// decodeRecord reads recCols and the time after them from their binary values (recOIDs), as
// scanRecord does through pgx: no state (a NULL row of an outer join) is errAbsent, an
// infinite timestamp ErrCorrupt.
func decodeRecord(v [][]byte, r *driver.Record, now *time.Time) error {
	if v[0] == nil { // the time is read all the same: a lookup that finds nothing still saw it
		var err error
		if *now, err = timestamptz(v[9], false); err != nil {
			return err
		}
		r.Fingerprint, r.Result, r.Trace = nil, nil, nil
		return errAbsent
	}
	if len(v[0]) != 2 || len(v[2]) != 8 || len(v[3]) != 4 {
		return fmt.Errorf("%w: pgstore: a record's integers of %d, %d and %d bytes", driver.ErrCorrupt, len(v[0]), len(v[2]), len(v[3]))
	}
	r.State = driver.State(int16(binary.BigEndian.Uint16(v[0])))
	r.Fingerprint = cloneBytea(v[1])
	r.Token = binary.BigEndian.Uint64(v[2])
	r.Attempts = uint32(binary.BigEndian.Uint32(v[3]))
	var err error
	if r.CreatedAt, err = timestamptz(v[4], false); err != nil {
		return err
	}
	if r.UpdatedAt, err = timestamptz(v[5], false); err != nil {
		return err
	}
	if r.LeaseExpiresAt, err = timestamptz(v[6], true); err != nil {
		return err
	}
	r.Result = cloneBytea(v[7])
	r.Trace = cloneBytea(v[8])
	if *now, err = timestamptz(v[9], false); err != nil {
		return err
	}
	return nil
}

// cloneBytea is a bytea's value as pgx's Scan into a []byte gives it: nil for NULL, a copy
// otherwise (an empty value is an empty slice, not nil).
func cloneBytea(v []byte) []byte {
	if v == nil || mutate.Name == mutate.PgRawAlias {
		return v
	}
	b := make([]byte, len(v))
	copy(b, v)
	return b
}

// pgEpochUnix is 2000-01-01 UTC, the origin of PostgreSQL's binary timestamps, in Unix seconds.
const pgEpochUnix = 946_684_800

// timestamptz decodes a binary timestamptz as pgx does (time.Unix: the local zone). NULL is the
// zero time if nullable, an error otherwise; an infinite one, or one of another size, is
// ErrCorrupt.
func timestamptz(v []byte, nullable bool) (time.Time, error) {
	switch {
	case v == nil && nullable:
		return time.Time{}, nil
	case v == nil:
		return time.Time{}, errors.New("pgstore: a NULL time") // as pgx's Scan into a time.Time
	case len(v) != 8:
		return time.Time{}, fmt.Errorf("%w: pgstore: a timestamp of %d bytes", driver.ErrCorrupt, len(v))
	}
	us := int64(binary.BigEndian.Uint64(v))
	if us == math.MaxInt64 || us == math.MinInt64 {
		return time.Time{}, fmt.Errorf("%w: pgstore: a record with an infinite timestamp", driver.ErrCorrupt)
	}
	return time.Unix(pgEpochUnix+us/1_000_000, us%1_000_000*1_000), nil
}
