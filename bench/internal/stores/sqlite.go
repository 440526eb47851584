package stores

import (
	"context"
	"database/sql"
	"errors"
	"net/url"
	"path/filepath"
	"time"

	_ "modernc.org/sqlite" // pure Go driver "sqlite": no cgo

	"github.com/receiptstore/receipts/bench/internal/workload"
)

// SQLite is a table with a (scope, id) primary key in WAL mode with synchronous=FULL, so
// every committed transaction is fsynced. Writes go through one connection (SQLite has one
// writer; a single writer connection is the usual Go setup and avoids busy-retry sleeps);
// reads use a pool, which WAL lets run beside the writer. The claim is an INSERT .. ON
// CONFLICT DO NOTHING (absent check and claim in one statement), the commit an UPDATE.
type SQLite struct {
	w, r                     *sql.DB
	claim, commit, get, get2 *sql.Stmt
}

const sqliteSchema = `CREATE TABLE IF NOT EXISTS receipts (
	scope      TEXT    NOT NULL,
	id         TEXT    NOT NULL,
	fp         BLOB    NOT NULL,
	state      INTEGER NOT NULL,
	token      INTEGER NOT NULL,
	result     BLOB,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL,
	lease_exp  INTEGER NOT NULL,
	PRIMARY KEY (scope, id)
) WITHOUT ROWID`

// OpenSQLite opens (creating) a SQLite database in dir; readers is the size of the read pool.
func OpenSQLite(dir string, readers int) (*SQLite, error) {
	q := url.Values{}
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "synchronous(FULL)")
	q.Add("_pragma", "busy_timeout(10000)")
	dsn := "file:" + filepath.Join(dir, "receipts.sqlite") + "?" + q.Encode()
	w, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	w.SetMaxOpenConns(1)
	if _, err := w.Exec(sqliteSchema); err != nil {
		w.Close()
		return nil, err
	}
	var mode string
	if err := w.QueryRow(`PRAGMA journal_mode`).Scan(&mode); err != nil || mode != "wal" {
		w.Close()
		return nil, errors.Join(errors.New("stores: sqlite is not in WAL mode: "+mode), err)
	}
	r, err := sql.Open("sqlite", dsn)
	if err != nil {
		w.Close()
		return nil, err
	}
	if readers < 1 {
		readers = 1
	}
	r.SetMaxOpenConns(readers)
	r.SetMaxIdleConns(readers)
	s := &SQLite{w: w, r: r}
	for _, p := range []struct {
		db  *sql.DB
		dst **sql.Stmt
		q   string
	}{
		{w, &s.claim, `INSERT INTO receipts (scope, id, fp, state, token, created_at, updated_at, lease_exp)
			VALUES (?, ?, ?, 1, ?, ?, ?, ?) ON CONFLICT DO NOTHING`},
		{w, &s.commit, `UPDATE receipts SET state = 2, result = ?, updated_at = ?, lease_exp = 0
			WHERE scope = ? AND id = ? AND token = ?`},
		{w, &s.get, `SELECT fp, state FROM receipts WHERE scope = ? AND id = ?`},
		{r, &s.get2, `SELECT fp, state, result FROM receipts WHERE scope = ? AND id = ?`},
	} {
		st, err := p.db.Prepare(p.q)
		if err != nil {
			s.Close()
			return nil, err
		}
		*p.dst = st
	}
	return s, nil
}

func (s *SQLite) Name() string { return "sqlite" }

func (s *SQLite) Close() error {
	for _, st := range []*sql.Stmt{s.claim, s.commit, s.get, s.get2} {
		if st != nil {
			st.Close()
		}
	}
	return errors.Join(s.r.Close(), s.w.Close())
}

func (s *SQLite) Do(ctx context.Context, k workload.Key, fp, result []byte) (bool, error) {
	now := time.Now().UnixNano()
	tok := now // the commit matches the claim on it, like a fencing token
	res, err := s.claim.ExecContext(ctx, k.Scope, k.ID, fp, tok, now, now, now+int64(30*time.Second))
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return false, err
	}
	if n == 0 {
		var gotFP []byte
		var state int
		if err := s.get.QueryRowContext(ctx, k.Scope, k.ID).Scan(&gotFP, &state); err != nil {
			return false, err
		}
		v := make([]byte, recordHeader)
		v[0] = byte(state)
		copy(v[1:33], gotFP)
		err := checkRecord(v, fp)
		return err == nil, err
	}
	res, err = s.commit.ExecContext(ctx, result, time.Now().UnixNano(), k.Scope, k.ID, tok)
	if err != nil {
		return false, err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return false, errors.Join(errors.New("stores: sqlite commit matched no claim"), err)
	}
	return false, nil
}

func (s *SQLite) Replay(ctx context.Context, k workload.Key, fp []byte) error {
	var gotFP, result []byte
	var state int
	err := s.get2.QueryRowContext(ctx, k.Scope, k.ID).Scan(&gotFP, &state, &result)
	if errors.Is(err, sql.ErrNoRows) {
		return ErrNotCommitted
	}
	if err != nil {
		return err
	}
	v := make([]byte, recordHeader)
	v[0] = byte(state)
	copy(v[1:33], gotFP)
	return checkRecord(v, fp)
}
