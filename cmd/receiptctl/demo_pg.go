package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgcluster"
	"github.com/receiptstore/receipts/pgstore"
)

// demoPGAuto is demo --pg's value when no DSN is given: start a throwaway
// cluster.
const demoPGAuto = "auto"

// pgNode is one node of the PostgreSQL demo: a service process's store, on
// its own pool, sharing the database and schema with the other nodes.
type pgNode struct {
	name string
	db   *receipts.DB
	pool *pgxpool.Pool
}

func (n *pgNode) close() error {
	if n == nil {
		return nil
	}
	err := n.db.Close()
	n.pool.Close()
	return err
}

// openDemoNode opens one node on dsn's database and schema: the demo's short
// lease, a LISTEN session so that a waiter here wakes when another node
// commits.
func openDemoNode(ctx context.Context, name, dsn, schema string, stderr io.Writer) (*pgNode, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, usagef("--pg: %v", err)
	}
	cfg.MaxConns = 8
	pgstore.Configure(cfg)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot connect to PostgreSQL at %s: %w", describeDSN(dsn), err)
	}
	db, err := pgstore.Open(ctx, pool, &pgstore.Options{
		Options:    receipts.Options{LeaseTTL: demoLeaseTTL, GCInterval: -1, Logger: newLogger(stderr)},
		Schema:     schema,
		ListenConn: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, dsn) },
	})
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("node %s: open schema %s at %s: %w", name, schema, describeDSN(dsn), err)
	}
	return &pgNode{name: name, db: db, pool: pool}, nil
}

// demoPG plays the demo on two nodes that share one PostgreSQL database:
// dsn, or a throwaway cluster (demoPGAuto).
func (a *app) demoPG(ctx context.Context, dsn string, schemaGiven bool) (err error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, demoTimeout+time.Minute) // a cluster may have to start
	defer cancel()
	d := &demo{a: a, out: a.stdout}
	if a.json {
		d.out = io.Discard
	}
	d.say("receipts demo on PostgreSQL: two nodes of one service share a database; retries land on either\n")
	throwaway := dsn == demoPGAuto
	if throwaway {
		d.say("starting a throwaway PostgreSQL cluster (no DSN given)...\n")
		c, err := pgcluster.Start(ctx)
		switch {
		case errors.Is(err, pgcluster.ErrNoServer):
			return fmt.Errorf("demo --pg without a DSN starts a throwaway cluster, but no PostgreSQL server binaries were found (Debian: apt-get install postgresql; or set PG_BINDIR); or give a server: receiptctl demo --pg postgres://user@host/db")
		case err != nil:
			return fmt.Errorf("start a throwaway PostgreSQL cluster: %w", err)
		}
		defer func() {
			if serr := c.Stop(); err == nil && serr != nil {
				err = serr
			}
		}()
		dsn = c.DSN
	}
	schema := a.schema
	if !schemaGiven {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		schema = "receipts_demo_" + hex.EncodeToString(b)
	}
	dir, err := demoDir(a.dir)
	if err != nil {
		return err
	}
	d.dir = dir
	d.provider = &provider{path: filepath.Join(dir, providerLog)}

	probe, err := openPGPool(ctx, dsn)
	if err != nil {
		return err
	}
	exists, err := hasPGStore(ctx, probe, schema)
	probe.Close()
	if err != nil {
		return err
	}
	if exists {
		return usagef("demo needs a fresh schema: %s already holds a store (give another with --schema)", schema)
	}
	d.say("database %s, schema %s (lease TTL %s for the demo; the default is %s)\n", describeDSN(dsn), schema, demoLeaseTTL, receipts.DefaultLeaseTTL)
	d.say("provider %s (a naive provider: it performs every call it gets)\n", d.provider.path)

	nodeA, err := openDemoNode(ctx, "A", dsn, schema, a.stderr)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := nodeA.close(); err == nil {
			err = cerr
		}
	}()
	nodeB, err := openDemoNode(ctx, "B", dsn, schema, a.stderr)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := nodeB.close(); err == nil {
			err = cerr
		}
	}()
	if err := d.runPG(ctx, nodeA, nodeB, dsn, schema); err != nil {
		return err
	}
	rep, err := d.report(ctx, nodeA.db, start)
	if err != nil {
		return err
	}
	rep.Dir = describeDSN(dsn) + " schema " + schema
	rep.LsCommand = "receiptctl --pg " + shellQuote(dsn) + " --schema " + schema + " ls"
	if throwaway {
		rep.LsCommand = "" // the cluster is gone once the demo ends
	}
	if a.json {
		if err := writeJSON(a.stdout, rep); err != nil {
			return err
		}
	} else {
		d.printPGReport(rep, throwaway)
	}
	if rep.DuplicateEffects != 0 {
		fmt.Fprintf(a.stderr, "receiptctl: the demo saw %d duplicate effects\n", rep.DuplicateEffects)
		return errProblems
	}
	return nil
}

// runPG plays the scenes on nodes a and b (and a third, crashing node in a
// child process).
func (d *demo) runPG(ctx context.Context, a, b *pgNode, dsn, schema string) error {
	d.say("\n1. A lost response, retried through the load balancer: %s\n", bookFlight)
	for i, step := range []struct {
		n    *pgNode
		note string
	}{{a, "response lost"}, {b, "the retry lands on the other node"}, {a, "delivered"}} {
		o := d.call(ctx, step.n.db, bookFlight)
		if o.err != nil {
			return o.err
		}
		d.say("   call %d  node %s  %s  (%s)\n", i+1, step.n.name, o.show(), step.note)
	}

	const racers = 4
	d.say("\n2. Racing retries on both nodes: %d calls at once of %s, 2 on node A, 2 on node B\n", racers, chargeCard)
	var wg sync.WaitGroup
	outs := make([]outcome, racers)
	startRace := make(chan struct{})
	for i := range outs {
		n := []*pgNode{a, b}[i%2]
		wg.Go(func() {
			<-startRace
			outs[i] = d.call(ctx, n.db, chargeCard)
		})
	}
	close(startRace)
	wg.Wait()
	ran, results, err := tally(outs)
	if err != nil {
		return err
	}
	d.say("   %d ran it, %d waited for its receipt (across nodes too) instead of running it: all %d got %s\n",
		ran, racers-ran, racers, strings.Join(sortedKeys(results), ", "))

	d.say("\n3. A key reused with other arguments, on node B: %s\n", bookOther)
	if o := d.call(ctx, b.db, bookOther); !errors.Is(o.err, receipts.ErrIntentMismatch) {
		return fmt.Errorf("reusing a key with other arguments: got %v, want %v", o.err, receipts.ErrIntentMismatch)
	} else {
		d.say("   call 1  node B  %s\n", o.show())
	}
	return d.crashPG(ctx, a, b, dsn, schema)
}

// crashPG: a third node, in a child process, claims the transfer, makes the
// provider perform it and is killed before it records it; the agent's retry
// lands on node B, which takes the claim over once the dead node's lease has
// run out, and reconciles with the provider; a last retry on node A replays.
func (d *demo) crashPG(ctx context.Context, a, b *pgNode, dsn, schema string) error {
	d.say("\n4. A node crashes mid-action: %s\n", transferOut)
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, exe, "demo-child", "--pg", dsn, "--schema", schema, "--dir", d.dir)
	cmd.Env = append(os.Environ(), demoChildEnv+"=1")
	cmd.Stderr = d.a.stderr
	providerKey, conf, err := d.runUntilEffect(cmd)
	if err != nil {
		return err
	}
	d.say("   call 1  node C (pid %d, a child process) claims %s, the provider performs it\n", cmd.Process.Pid, transferOut.id)
	d.say("           with idempotency key %s (the lease's ProviderKey) -> %s,\n", short(providerKey), conf)
	d.say("           and node C is killed (%s) before it records the receipt\n", cmd.ProcessState)
	if r, err := b.db.Lookup(ctx, transferOut.key()); err != nil {
		return fmt.Errorf("after the crash: %w", err)
	} else {
		d.say("   node B sees %s %s (attempt %d, lease runs out in %s): its outcome is unknown\n",
			transferOut.id, r.State, r.Attempts, max(time.Until(r.LeaseExpiresAt), 0).Round(time.Millisecond))
	}
	for i, step := range []struct {
		n    *pgNode
		what string
	}{{b, "the agent retries, on node B"}, {a, "and once more, on node A"}} {
		t0 := time.Now()
		o := d.call(ctx, step.n.db, transferOut)
		if o.err != nil {
			return o.err
		}
		if o.recovered {
			d.say("   call %d  node %s  (%s) waited %s for the dead node's lease, took the claim over (attempt %d, Recovered),\n",
				i+2, step.n.name, step.what, time.Since(t0).Round(10*time.Millisecond), o.attempt)
			d.say("           %s\n", o.show())
			continue
		}
		d.say("   call %d  node %s  %s  (%s)\n", i+2, step.n.name, o.show(), step.what)
	}
	return nil
}

func (d *demo) printPGReport(rep *demoReport, throwaway bool) {
	d.say("\nReport\n")
	tw := newTable(d.out)
	fmt.Fprintf(tw, "  nodes\t3\t(A and B in this process, C in a child process; one database)\n")
	fmt.Fprintf(tw, "  calls attempted\t%d\n", rep.CallsAttempted)
	fmt.Fprintf(tw, "  effects performed\t%d\t(lines in the provider's log)\n", rep.EffectsPerformed)
	fmt.Fprintf(tw, "  duplicate effects\t%d\n", rep.DuplicateEffects)
	fmt.Fprintf(tw, "  receipts\t%d succeeded, %d failed, %d pending\n",
		rep.Receipts["succeeded"], rep.Receipts["failed"], rep.Receipts["pending"])
	fmt.Fprintf(tw, "  took\t%s\n", rep.Took)
	_ = tw.Flush()
	if throwaway {
		d.say("\nThe throwaway cluster is stopped and removed now. To keep the store and look at it\n")
		d.say("with receiptctl --pg DSN ls, give a server: receiptctl demo --pg postgres://user@host/db\n")
		return
	}
	d.say("\nLook at them: %s\n", rep.LsCommand)
}
