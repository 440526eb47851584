// Command claimanatomy measures what a first call costs PostgreSQL's server, statement by
// statement: pgstore's own first claim and finish, beside the floor's INSERT and UPDATE, and
// beside reshaped claims that the schema could allow (a live records table that is not
// partitioned, no PL/pgSQL function, no advisory lock, no tombstone probe). It is the
// measurement behind docs/performance.md's "Anatomy of a first call on PostgreSQL": which
// change to the schema would buy what, before anyone builds it.
//
//	go run ./cmd/claimanatomy                 # a throwaway cluster, 3 rounds of 5 s
//	go run ./cmd/claimanatomy -dsn postgres://… -duration 10s -rounds 5
//
// Every variant runs in one pgbench run (pgbench -M prepared -c 1, one script per variant,
// picked at random for each transaction), so that whatever else loads the machine loads all of
// them alike; each transaction is a new key's claim and then its finish, and the sessions run
// with synchronous_commit = off, so that the figures are the statements' own work (parse and
// plan cached, bind and execute, and the reply), not the WAL flush every variant waits for
// alike. The schemas it sets up:
//
//   - fresh: pgstore.Open's schema as receiptbench measures it (a store younger than its
//     retention: the current records partition and the two created ahead, one markers
//     partition), with 2,000 receipts (-receipts);
//   - aged: the same with the partitions of a store older than its retention + tombstone
//     window (a records partition for every live epoch, a markers partition for every one in
//     force), 2,000 records in each and 5,000 markers in each (2.5 × -receipts);
//   - flat: aged's rows in a records table that is not partitioned (primary key (scope, id),
//     an index on epoch for GC), aged's markers;
//   - mflat: aged's records partitions, and aged's markers in one table that is not
//     partitioned.
//
// The variants (claim; finish), each a script of its own:
//
//   - floor: the floor's INSERT … ON CONFLICT DO NOTHING; its UPDATE (bench/internal/stores);
//   - shipped-fresh, shipped-aged: pgstore's claim_fresh_v1 call as the engine sends it; the
//     finish aimed at the key's records partition (finishIn);
//   - fresh-aimed: shipped-fresh with the function's insert aimed at the current records
//     partition instead of the partitioned parent (the issue's "statements aimed at one
//     partition", for the insert: the probe has to look in every live partition anyway);
//   - markers-flat: shipped-aged with the markers in one table that is not partitioned;
//   - flat-function: claim_fresh_v1 over the flat table; the fenced finish on it;
//   - flat-pipelined: the function's locks as one statement, then one statement doing its
//     work (erasure check, tombstone probes, insert), pipelined in one round trip;
//   - flat-plain: one INSERT … ON CONFLICT (scope, id) DO NOTHING with the erasure check and no
//     lock and no tombstone probe: what is left once the table's unique key arbitrates first
//     claims, EraseScope no longer relies on a lock claims share, and tombstones live in the
//     records table.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/bench/internal/pgtemp"
	"github.com/receiptstore/receipts/pgstore"
)

func main() {
	dsn := flag.String("dsn", "", "PostgreSQL DSN (default: a throwaway cluster from the installed server binaries)")
	dur := flag.Duration("duration", 5*time.Second, "length of one pgbench round (all variants together)")
	rounds := flag.Int("rounds", 3, "pgbench rounds")
	n := flag.Int("receipts", 2000, "receipts in each records partition of the schemas")
	flag.Parse()
	ctx := context.Background()
	if err := run(ctx, os.Stdout, *dsn, *dur, *rounds, *n); err != nil {
		fmt.Fprintln(os.Stderr, "claimanatomy:", err)
		os.Exit(1)
	}
}

// run sets the schemas up on dsn (or a throwaway cluster) with n receipts per records
// partition, runs the rounds and prints the table.
func run(ctx context.Context, w io.Writer, dsn string, dur time.Duration, rounds, n int) error {
	bin, err := pgtemp.FindBinDir()
	if err != nil {
		return err
	}
	if dsn == "" {
		c, err := pgtemp.Start(ctx)
		if err != nil {
			return err
		}
		defer func() { _ = c.Stop() }()
		dsn = c.DSN
	}
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	p, err := setUp(ctx, pool, n)
	if err != nil {
		return fmt.Errorf("set up: %w", err)
	}
	dir, err := os.MkdirTemp("", "claimanatomy")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	var files []string
	for _, v := range variants {
		f := filepath.Join(dir, v.name+".sql")
		if err := os.WriteFile(f, []byte(p.script(v)), 0o644); err != nil {
			return err
		}
		files = append(files, f)
	}
	res := map[string][]timing{}
	for r := 0; r < rounds; r++ {
		out, err := pgbench(ctx, bin, dsn, dur, files)
		if err != nil {
			return err
		}
		got, err := parse(out)
		if err != nil {
			return err
		}
		for _, v := range variants {
			t, ok := got[v.name]
			if !ok || t.n == 0 {
				return fmt.Errorf("round %d: no transactions of %s:\n%s", r+1, v.name, out)
			}
			res[v.name] = append(res[v.name], t)
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "variant\tclaim µs\tfinish µs\ttotal µs\tx floor\t\n")
	floor := median(res["floor"], func(t timing) float64 { return t.claim }) + median(res["floor"], func(t timing) float64 { return t.finish })
	for _, v := range variants {
		ts := res[v.name]
		c, f := median(ts, func(t timing) float64 { return t.claim }), median(ts, func(t timing) float64 { return t.finish })
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.2f\t\n", v.name, spread(ts, func(t timing) float64 { return t.claim }),
			spread(ts, func(t timing) float64 { return t.finish }), fmt.Sprintf("%.0f", c+f), (c+f)/floor)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "server time per statement (bind, execute, reply), µs, median (and range) of %d rounds of %s; synchronous_commit = off; x floor: the floor's claim + finish over the variant's\n", rounds, dur)
	return nil
}

// params are the values the engine would send for a claim now (pgstore's engine.go: oldest,
// markerBottom, recordBottom).
type params struct {
	widthUS, retentionUS, windowUS, k int64
	ep, oldest, mbottom, rbottom      int64
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// setUp creates the schemas (fresh, aged, flat, mflat, and the floor's table) with n receipts
// per records partition and returns the claim's parameters.
func setUp(ctx context.Context, pool *pgxpool.Pool, n int) (params, error) {
	var p params
	for _, s := range []string{"anat_fresh", "anat_aged", "anat_flat", "anat_mflat"} {
		if _, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+s+` CASCADE`); err != nil {
			return p, err
		}
	}
	for _, s := range []string{"anat_fresh", "anat_aged"} {
		db, err := pgstore.Open(ctx, pool, &pgstore.Options{Schema: s})
		if err != nil {
			return p, err
		}
		for i := range n {
			if _, err := db.Do(ctx, receipts.Key{Scope: "s", ID: fmt.Sprintf("k%d", i)}, []byte("f"),
				func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("result"), nil }); err != nil {
				_ = db.Close()
				return p, err
			}
		}
		if err := db.Close(); err != nil {
			return p, err
		}
	}
	var nowUS int64
	var win *int64
	if err := pool.QueryRow(ctx, `SELECT epoch_width_us, retention_us, tombstone_window_us, marker_width_us,
       floor(extract(epoch FROM clock_timestamp()) * 1000000)::bigint FROM anat_fresh.meta`).Scan(
		&p.widthUS, &p.retentionUS, &win, &p.k, &nowUS); err != nil {
		return p, err
	}
	if win == nil || *win <= 0 {
		return p, errors.New("the schema has tombstones off; the variants assume them on (the default)")
	}
	p.windowUS, p.k = *win, p.k/p.widthUS
	p.ep = floorDiv(nowUS, p.widthUS)
	p.oldest = floorDiv(nowUS-p.retentionUS, p.widthUS) - 1
	p.mbottom = floorDiv(floorDiv(nowUS-p.retentionUS-p.windowUS, p.widthUS)-1, p.k)
	p.rbottom = p.mbottom * p.k
	var stmts []string
	add := func(format string, a ...any) { stmts = append(stmts, fmt.Sprintf(format, a...)) }
	// aged: every live records partition, every markers partition in force, with rows
	for ep := p.oldest; ep <= p.ep+2; ep++ {
		add(`CREATE TABLE IF NOT EXISTS anat_aged.records_e%d PARTITION OF anat_aged.records FOR VALUES FROM (%d) TO (%d) WITH (fillfactor = 90)`, ep, ep, ep+1)
		if ep < p.ep {
			add(`INSERT INTO anat_aged.records SELECT scope, id || convert_to('/e%d', 'UTF8'), %d, state, fp, token, attempts, nonce,
  created_at, updated_at, lease_expires_at, result, meta, journal FROM anat_aged.records_e%d`, ep, ep, p.ep)
		}
	}
	for m := p.mbottom; m <= floorDiv(p.ep, p.k); m++ {
		add(`CREATE TABLE IF NOT EXISTS anat_aged.markers_e%d PARTITION OF anat_aged.markers FOR VALUES FROM (%d) TO (%d)`, m, m, m+1)
		add(`INSERT INTO anat_aged.markers SELECT 's', convert_to('m%d/' || i, 'UTF8'), %d, clock_timestamp() - interval '1 day'
  FROM generate_series(1, %d) i`, m, m, 5*n/2)
	}
	// flat: aged's rows in one table, aged's markers, the function and the tables it reads
	add(`CREATE SCHEMA anat_flat`)
	add(`CREATE SEQUENCE anat_flat.token_seq AS bigint CACHE 1 NO CYCLE`)
	add(`CREATE TABLE anat_flat.records (LIKE anat_aged.records INCLUDING DEFAULTS, PRIMARY KEY (scope, id)) WITH (fillfactor = 90)`)
	add(`CREATE INDEX ON anat_flat.records (epoch)`)
	add(`INSERT INTO anat_flat.records SELECT * FROM anat_aged.records`)
	add(`CREATE TABLE anat_flat.markers (LIKE anat_aged.markers INCLUDING DEFAULTS, PRIMARY KEY (scope, id, epoch)) PARTITION BY RANGE (epoch)`)
	for m := p.mbottom; m <= floorDiv(p.ep, p.k); m++ {
		add(`CREATE TABLE anat_flat.markers_e%d PARTITION OF anat_flat.markers FOR VALUES FROM (%d) TO (%d)`, m, m, m+1)
	}
	add(`INSERT INTO anat_flat.markers SELECT * FROM anat_aged.markers`)
	add(`CREATE TABLE anat_flat.erasures (LIKE anat_aged.erasures INCLUDING ALL)`)
	// mflat: aged's records partitions, aged's markers in one table that is not partitioned
	add(`CREATE SCHEMA anat_mflat`)
	add(`CREATE SEQUENCE anat_mflat.token_seq AS bigint CACHE 1 NO CYCLE`)
	add(`CREATE TABLE anat_mflat.records (LIKE anat_aged.records INCLUDING DEFAULTS, PRIMARY KEY (scope, id, epoch)) PARTITION BY RANGE (epoch)`)
	for ep := p.oldest; ep <= p.ep+2; ep++ {
		add(`CREATE TABLE anat_mflat.records_e%d PARTITION OF anat_mflat.records FOR VALUES FROM (%d) TO (%d) WITH (fillfactor = 90)`, ep, ep, ep+1)
	}
	add(`INSERT INTO anat_mflat.records SELECT * FROM anat_aged.records`)
	add(`CREATE TABLE anat_mflat.markers (LIKE anat_aged.markers INCLUDING DEFAULTS, PRIMARY KEY (scope, id, epoch))`)
	add(`INSERT INTO anat_mflat.markers SELECT * FROM anat_aged.markers`)
	add(`CREATE TABLE anat_mflat.erasures (LIKE anat_aged.erasures INCLUDING ALL)`)
	add(`DROP TABLE IF EXISTS pg_floor`)
	add(`CREATE TABLE pg_floor (scope TEXT NOT NULL, id TEXT NOT NULL, fp BYTEA NOT NULL, state SMALLINT NOT NULL,
  token BIGINT NOT NULL, result BYTEA, updated_at TIMESTAMPTZ NOT NULL, PRIMARY KEY (scope, id))`)
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			return p, fmt.Errorf("%s: %w", s, err)
		}
	}
	var fn string
	if err := pool.QueryRow(ctx, `SELECT pg_get_functiondef('anat_aged.claim_fresh_v1'::regproc)`).Scan(&fn); err != nil {
		return p, err
	}
	for _, s := range []string{"anat_flat", "anat_mflat"} {
		if _, err := pool.Exec(ctx, strings.ReplaceAll(strings.ReplaceAll(fn, `"anat_aged".`, s+`.`), `anat_aged.`, s+`.`)); err != nil {
			return p, fmt.Errorf("the function in %s: %w", s, err)
		}
	}
	// fresh-aimed: anat_fresh's function (read from anat_aged, the same text) with its insert
	// aimed at the current records partition instead of the partitioned parent
	aimed := strings.ReplaceAll(strings.ReplaceAll(fn, `"anat_aged".`, `anat_fresh.`), `anat_aged.`, `anat_fresh.`)
	aimed = strings.Replace(aimed, "claim_fresh_v1(", "claim_fresh_aimed(", 1)
	if n := strings.Count(aimed, "INSERT INTO anat_fresh.records AS r"); n != 2 { // the two branches: tombstones on and off
		return p, fmt.Errorf("fresh-aimed: the function has %d inserts into the records table, want 2", n)
	}
	aimed = strings.ReplaceAll(aimed, "INSERT INTO anat_fresh.records AS r", fmt.Sprintf("INSERT INTO anat_fresh.records_e%d AS r", p.ep))
	if _, err := pool.Exec(ctx, aimed); err != nil {
		return p, fmt.Errorf("fresh-aimed's function: %w", err)
	}
	_, err := pool.Exec(ctx, `ANALYZE`)
	return p, err
}

// A variant is a claim and a finish, as one pgbench script; its statements are the templates
// script fills in (@schema@, @part@ the current records partition or the flat table, and the
// claim's parameters).
type variant struct {
	name, schema, part string
	claim, finish      string
}

// key is the transaction's new key, as bytea.
const key = `convert_to('k' || :k || ':' || :client_id, 'UTF8')`

const callFn = `SELECT (f.o_rec).token AS tok FROM @schema@.claim_fresh_v1(12345, 678, '\x0102'::bytea, '\x73'::bytea, ` + key + `,
  '\x01'::bytea, '\x0a0b0c0d0e0f'::bytea, 30000000::bigint, @width@::bigint, @oldest@::bigint, NULL::timestamptz, false,
  @mbottom@::bigint, @rbottom@::bigint, @tomb@::bigint) f \gset`

const clockCTE = `WITH t AS MATERIALIZED (SELECT n AS now, floor(extract(epoch FROM n) * 1000000 / @width@::bigint)::bigint AS ep
  FROM (SELECT greatest(clock_timestamp(), NULL::timestamptz) AS n) s)`

// finishIn is pgstore's finish (queries.go, finishIn) on @part@.
const finishIn = clockCTE + `
UPDATE @part@ r SET state = 2::smallint, result = '\x02'::bytea, meta = NULL::bytea, lease_expires_at = NULL, updated_at = t.now, epoch = t.ep
  FROM t
 WHERE r.scope = '\x73'::bytea AND r.id = ` + key + ` AND r.epoch >= @oldest@ AND r.token = :tok AND r.state = 1
   AND r.updated_at + @retention@::bigint * interval '1 microsecond' > t.now
 RETURNING r.state, r.fp, r.token, r.attempts, r.created_at, r.updated_at, r.lease_expires_at, r.result, r.meta, t.now, pg_current_xact_id()::text;`

// insertChecked is the fresh claim's work without the function: the erasure check, the
// tombstone probes and the insert, in one statement.
const insertChecked = clockCTE + `
INSERT INTO anat_flat.records AS r (scope, id, epoch, state, fp, token, attempts, nonce, created_at, updated_at, lease_expires_at)
SELECT '\x73'::bytea, ` + key + `, t.ep, 1, '\x01'::bytea, nextval('anat_flat.token_seq'), 1, '\x0a0b0c0d0e0f'::bytea, t.now, t.now,
       t.now + 30000000::bigint * interval '1 microsecond' FROM t
 WHERE NOT EXISTS (SELECT 1 FROM anat_flat.erasures e WHERE e.scope_id = '\x0102'::bytea AND e.until > t.now)@tomb_probe@
ON CONFLICT (scope, id) DO NOTHING RETURNING r.token`

const tombProbe = `
   AND NOT EXISTS (SELECT 1 FROM anat_flat.markers m WHERE m.scope = '\x73'::bytea AND m.id = ` + key + ` AND m.epoch >= @mbottom@
                      AND m.used_at + @tomb@::bigint * interval '1 microsecond' > t.now)`

var variants = []variant{
	{name: "floor",
		claim: `INSERT INTO pg_floor (scope, id, fp, state, token, updated_at) VALUES ('s', 'k' || :k || ':' || :client_id, '\x01', 1, :k, now())
  ON CONFLICT (scope, id) DO NOTHING RETURNING 1;`,
		finish: `UPDATE pg_floor SET state = 2, result = '\x02', updated_at = now() WHERE scope = 's' AND id = 'k' || :k || ':' || :client_id AND token = :k;`},
	{name: "shipped-fresh", schema: "anat_fresh", part: "anat_fresh.records_e@ep@", claim: callFn, finish: finishIn},
	{name: "fresh-aimed", schema: "anat_fresh", part: "anat_fresh.records_e@ep@",
		claim: strings.Replace(callFn, "claim_fresh_v1(", "claim_fresh_aimed(", 1), finish: finishIn},
	{name: "shipped-aged", schema: "anat_aged", part: "anat_aged.records_e@ep@", claim: callFn, finish: finishIn},
	{name: "markers-flat", schema: "anat_mflat", part: "anat_mflat.records_e@ep@", claim: callFn, finish: finishIn},
	{name: "flat-function", schema: "anat_flat", part: "anat_flat.records", claim: callFn, finish: finishIn},
	{name: "flat-pipelined", schema: "anat_flat", part: "anat_flat.records",
		claim: `\startpipeline
SELECT pg_advisory_xact_lock(7, 12345), pg_advisory_xact_lock_shared(8, 678);
` + strings.ReplaceAll(insertChecked, "@tomb_probe@", tombProbe) + `;
\endpipeline`,
		// a pipeline cannot \gset: the finish is fenced by the key's nonce instead of its token
		finish: strings.ReplaceAll(finishIn, "r.token = :tok", "r.nonce = '\\x0a0b0c0d0e0f'::bytea")},
	{name: "flat-plain", schema: "anat_flat", part: "anat_flat.records",
		claim: strings.ReplaceAll(insertChecked, "@tomb_probe@", "") + ` AS tok \gset`, finish: finishIn},
}

// script is v's pgbench script with p's values filled in.
func (p params) script(v variant) string {
	r := strings.NewReplacer("@schema@", v.schema, "@part@", strings.ReplaceAll(v.part, "@ep@", strconv.FormatInt(p.ep, 10)),
		"@width@", strconv.FormatInt(p.widthUS, 10), "@oldest@", strconv.FormatInt(p.oldest, 10),
		"@mbottom@", strconv.FormatInt(p.mbottom, 10), "@rbottom@", strconv.FormatInt(p.rbottom, 10),
		"@tomb@", strconv.FormatInt(p.retentionUS+p.windowUS, 10), "@retention@", strconv.FormatInt(p.retentionUS, 10))
	return r.Replace("\\set k random(1, 2000000000)\n" + v.claim + "\n" + v.finish + "\n")
}

// pgbench runs one round of every script, interleaved, on one connection.
func pgbench(ctx context.Context, bin, dsn string, dur time.Duration, files []string) (string, error) {
	args := []string{"-n", "-M", "prepared", "-c", "1", "-T", strconv.Itoa(max(1, int(dur.Round(time.Second)/time.Second))), "-r"}
	for _, f := range files {
		args = append(args, "-f", f)
	}
	args = append(args, dsn)
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "pgbench"), args...)
	cmd.Env = append(os.Environ(), "PGOPTIONS=-c synchronous_commit=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	return string(out), nil
}

// timing is one variant's result in one round: transactions, and the claim's and the
// finish's server time in µs (the claim's lines up to the finish: a pipeline's time is on its
// \endpipeline line).
type timing struct {
	n             int
	claim, finish float64
}

var (
	scriptLine = regexp.MustCompile(`^SQL script \d+: .*/([a-z-]+)\.sql$`)
	txLine     = regexp.MustCompile(`^ - (\d+) transactions`)
	stmtLine   = regexp.MustCompile(`^\s+([0-9.]+)\s+\d+\s+(.*)$`)
)

// parse reads pgbench -r's per-script sections.
func parse(out string) (map[string]timing, error) {
	got := map[string]timing{}
	var name string
	var lines []float64
	var texts []string
	flush := func() {
		if name == "" {
			return
		}
		t := got[name]
		// the last statement is the finish; everything before it (\set aside) the claim
		for i, ms := range lines {
			switch {
			case i == len(lines)-1:
				t.finish = ms * 1000
			case !strings.HasPrefix(texts[i], `\set`):
				t.claim += ms * 1000
			}
		}
		got[name] = t
		lines, texts = nil, nil
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		l := sc.Text()
		if m := scriptLine.FindStringSubmatch(l); m != nil {
			flush()
			name = m[1]
			continue
		}
		if name == "" {
			continue
		}
		if m := txLine.FindStringSubmatch(l); m != nil {
			t := got[name]
			t.n, _ = strconv.Atoi(m[1])
			got[name] = t
			continue
		}
		if m := stmtLine.FindStringSubmatch(l); m != nil {
			ms, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				return nil, err
			}
			lines, texts = append(lines, ms), append(texts, m[2])
		}
	}
	flush()
	if len(got) == 0 {
		return nil, fmt.Errorf("no per-script sections in pgbench's output:\n%s", out)
	}
	return got, nil
}

func median(ts []timing, f func(timing) float64) float64 {
	v := make([]float64, len(ts))
	for i, t := range ts {
		v[i] = f(t)
	}
	sort.Float64s(v)
	if len(v) == 0 {
		return 0
	}
	return v[len(v)/2]
}

// spread is "median (min–max)" of f over ts, in µs.
func spread(ts []timing, f func(timing) float64) string {
	if len(ts) < 2 {
		return fmt.Sprintf("%.0f", median(ts, f))
	}
	lo, hi := f(ts[0]), f(ts[0])
	for _, t := range ts {
		lo, hi = min(lo, f(t)), max(hi, f(t))
	}
	return fmt.Sprintf("%.0f (%.0f–%.0f)", median(ts, f), lo, hi)
}
