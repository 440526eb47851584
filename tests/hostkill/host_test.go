package hostkill_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/intents/intentsmcp"
	"github.com/receiptstore/receipts/intents/intentspg"
)

// The kinds of actions the host approves, by the end of their intent.
const (
	kindOK   = "ok"   // charged once: Succeeded with its one effect
	kindBad  = "bad"  // amount 0, refused and stored: Failed, no effect
	kindDown = "down" // to a route that is down, with a short deadline: Uncertain, no effect
)

// downDeadline is the deadline of the kindDown actions; the others get
// okDeadline, far beyond the run.
const (
	downDeadline = 300 * time.Millisecond
	okDeadline   = 2 * time.Minute
)

// openJournal opens the host's journal on the run's engine.
func openJournal(ctx context.Context, c config) (*intents.Journal, func(), error) {
	opts := &intents.Options{PollInterval: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	switch c.Engine {
	case "pebble":
		j, err := intents.Open(filepath.Join(c.Dir, "journal"), opts)
		return j, func() {}, err
	case "pg":
		pool, err := pgxpool.New(ctx, c.DSN)
		if err != nil {
			return nil, nil, err
		}
		j, err := intentspg.Open(ctx, pool, &intentspg.Options{Schema: c.HostSchema, Journal: opts})
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		return j, pool.Close, nil
	}
	return nil, nil, fmt.Errorf("unknown engine %q", c.Engine)
}

// runHost is the host child: it resumes the journal's actions, approves a
// few new ones, and delivers until every action is done (or SIGKILL).
func runHost(c config) error {
	ctx := context.Background()
	j, closePool, err := openJournal(ctx, c)
	if err != nil {
		return err
	}
	defer closePool()
	defer j.Close()
	resumed := 0
	for _, err := range j.List(ctx, intents.Approved) {
		if err != nil {
			return err
		}
		resumed++
	}
	base := "http://127.0.0.1:" + strconv.Itoa(c.Port)
	var tr intents.Transport
	switch c.Wire {
	case "http":
		tr = &intents.HTTPTransport{BaseURL: base}
	case "mcp":
		client := mcp.NewClient(&mcp.Implementation{Name: "host"}, nil)
		mt := intentsmcp.New(func(ctx context.Context) (*mcp.ClientSession, error) {
			return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base, MaxRetries: -1}, nil)
		}, nil)
		defer mt.Close()
		tr = mt
	}
	d, err := intents.NewDispatcher(j, intents.DispatcherOptions{
		Transports:     map[string]intents.Transport{"billing": tr},
		AttemptTimeout: 3 * time.Second,
		MinBackoff:     5 * time.Millisecond,
		MaxBackoff:     100 * time.Millisecond,
		// A host SIGKILLed mid-delivery holds its actions until its
		// attempt would have timed out, plus this: then another host (or
		// a next run under another HostName) takes them over.
		LeaseMargin: 500 * time.Millisecond,
		HostName:    c.HostName,
	})
	if err != nil {
		return err
	}
	defer d.Close()
	fmt.Printf("READY resumed=%d\n", resumed)

	if !c.Final {
		approvals, err := openLog(c.Dir, approvalsLog)
		if err != nil {
			return err
		}
		rng := rand.New(rand.NewPCG(c.Seed, uint64(c.Gen)))
		for i := range c.Approvals {
			time.Sleep(time.Duration(rng.IntN(10_000)) * time.Microsecond)
			kind, op, amount, dl := kindOK, "charge", 1+rng.IntN(100), okDeadline
			switch n := rng.IntN(10); {
			case c.OnlyOK:
			case n == 0:
				kind, amount = kindBad, 0
			case n == 1:
				kind, op, dl = kindDown, "down", downDeadline
			}
			if c.Wire == "http" {
				op = map[string]string{"charge": "POST /v1/charges", "down": "POST /v1/down"}[op]
			}
			intent := fmt.Sprintf("g%d.%d.%s", c.Gen, i, kind)
			// The intent is the approval's Ref: an Approve that failed
			// (PostgreSQL restarting: its commit may or may not have
			// landed) is made again with it, and returns the action if
			// it landed.
			ap := intents.Approval{Target: "billing", Operation: op, Ref: intent,
				Arguments: chargeArgs{Intent: intent, Amount: amount}, ApprovedBy: "harness",
				Deadline: time.Now().Add(dl)}
			a, err := j.Approve(ctx, ap)
			for tries := 0; err != nil && !errors.Is(err, intents.ErrInvalid) && tries < 600; tries++ {
				time.Sleep(50 * time.Millisecond)
				ap.Deadline = time.Now().Add(dl) // (the stored action keeps its own)
				a, err = j.Approve(ctx, ap)
			}
			if err != nil {
				return err
			}
			if err := approvals.add(intent, a.Key); err != nil {
				return err
			}
		}
	}
	// Deliver until nothing is left Approved. (A failed List, PostgreSQL
	// restarting, is tried again.)
	for {
		left, failed := 0, false
		for _, err := range j.List(ctx, intents.Approved) {
			if err != nil {
				failed = true
				break
			}
			left++
		}
		if left == 0 && !failed {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	fmt.Println("DONE")
	return nil
}
