package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/encoding"
	"github.com/spf13/cobra"
)

// The demo's settings.
const (
	demoScope = "agent-7" // the authenticated caller: one agent principal
	// demoLeaseTTL is short so that taking over the crashed child's claim
	// waits about a second, not the default 30s.
	demoLeaseTTL = time.Second
	demoTimeout  = 30 * time.Second
	// demoChildEnv must be set for the hidden demo-child command: the demo
	// sets it when it re-executes this binary.
	demoChildEnv = "RECEIPTCTL_DEMO_CHILD"
	// providerLog is the demo provider's log, in the store directory.
	providerLog = "provider.log"
)

// demoReport is the demo's summary; demo --json prints it.
type demoReport struct {
	Dir              string           `json:"dir"`
	ProviderLog      string           `json:"provider_log"`
	CallsAttempted   int64            `json:"calls_attempted"`
	EffectsPerformed int              `json:"effects_performed"`
	DuplicateEffects int              `json:"duplicate_effects"`
	HostRestarts     int              `json:"host_restarts"`
	Receipts         map[string]int64 `json:"receipts"` // by state
	LsCommand        string           `json:"ls_command"`
	Took             string           `json:"took"`
}

// toolCall is one tool call of the agent: the tool, its arguments, and the
// operation key minted when the action was approved.
type toolCall struct {
	tool string
	id   string
	args map[string]any
}

func (c toolCall) key() receipts.Key { return receipts.Key{Scope: demoScope, ID: c.id} }

// fingerprint is the digest of the call's intent: the tool and its arguments.
func (c toolCall) fingerprint() ([]byte, error) {
	return encoding.Fingerprint(map[string]any{"tool": c.tool, "args": c.args})
}

func (c toolCall) String() string {
	var args []string
	for _, k := range sortedKeys(c.args) {
		args = append(args, fmt.Sprintf("%s=%v", k, c.args[k]))
	}
	return fmt.Sprintf("%s(%s) [key %s]", c.tool, strings.Join(args, ", "), c.id)
}

// The agent's tool calls.
var (
	bookFlight  = toolCall{"book_flight", "trip-1", map[string]any{"flight": "LH 401", "date": "2026-12-24"}}
	bookOther   = toolCall{"book_flight", "trip-1", map[string]any{"flight": "LH 403", "date": "2026-12-24"}}
	chargeCard  = toolCall{"charge_card", "pay-1", map[string]any{"amount_cents": 129900, "currency": "EUR"}}
	sendEmail   = toolCall{"send_email", "mail-1", map[string]any{"to": "traveller@example.invalid", "template": "itinerary"}}
	transferOut = toolCall{"transfer", "xfer-1", map[string]any{"amount_cents": 25000, "to": "savings"}}
)

func (a *app) demoCmd() *cobra.Command {
	var pg string
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Play an agent whose tool calls are retried, raced and crashed, on a fresh store",
		Long: `demo plays an AI agent's tool runtime against a fresh store and a naive
provider that performs every call it gets (its log is provider.log in the
store directory). The agent's responses get lost and it retries; retries of
one call race each other; a key is reused with other arguments (rejected); a
provider declines for good (a failed receipt, replayed); and the service
crashes mid-action: a child process claims the key, makes the provider
perform the effect and is killed with SIGKILL before it records it. After
the restart the next attempt recovers the claim, asks the provider whether
the effect happened (by the lease's ProviderKey) and commits it without
performing it again. Then the agent host crashes: a host process (package
intents) approves a refund, its journal keeps the new operation key with the
request, and it is killed after the service (receipthttp, on 127.0.0.1)
performed the refund but before the answer reached it; the restarted host
approves the same tool call again, gets the same action and key back, and
the service answers from its receipt.

It ends with a report: calls attempted, effects performed, duplicate effects
(0, or exit code 1), host restarts, and receipts by state. The store is kept: look at it with
the ls command the report prints. The directory is new, under the system's
temporary directory, unless --dir names one (which must not exist or be empty).

With --pg, the demo runs on PostgreSQL (pgstore), on two nodes of one service
that share a database, each with its own pool and LISTEN session: a retry
that lands on the other node is answered with the stored receipt, racing
calls on both nodes run the effect once (the others wait across nodes), and a
third node, a child process, crashes mid-action; node B takes its claim over.
--pg DSN uses that server, in a new schema (or --schema, which must hold no
store); --pg alone starts a throwaway cluster from the installed server
binaries, stopped and removed at the end. --dir then holds only the
provider's log.`,
		Example: `  receiptctl demo
  receiptctl demo --dir /tmp/demo && receiptctl --dir /tmp/demo ls
  receiptctl demo --pg postgres://postgres@127.0.0.1:5432/postgres
  receiptctl demo --pg      # a throwaway cluster
  go run ./cmd/receiptctl demo --json`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 || len(args) == 1 && pg == demoPGAuto {
				return nil // demo --pg DSN: the flag takes an optional value
			}
			return usagef("demo takes no arguments (give a DSN as --pg DSN)")
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if a.addr != "" {
				return usagef("demo runs on a fresh store: --addr does not apply")
			}
			if len(args) == 1 {
				pg = args[0]
			}
			if pg != "" {
				return a.demoPG(cmd.Context(), pg, cmd.Flags().Changed("schema"))
			}
			return a.demo(cmd.Context())
		},
	}
	cmd.Flags().StringVar(&pg, "pg", "", "play the demo on PostgreSQL, on two nodes sharing one database: --pg DSN, or --pg alone for a throwaway cluster")
	cmd.Flags().Lookup("pg").NoOptDefVal = demoPGAuto
	return cmd
}

// demo is one run of the demo.
type demo struct {
	a        *app
	out      io.Writer // the story; io.Discard with --json
	dir      string
	provider *provider
	calls    atomic.Int64
}

func (a *app) demo(ctx context.Context) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, demoTimeout)
	defer cancel()
	dir, err := demoDir(a.dir)
	if err != nil {
		return err
	}
	d := &demo{a: a, out: a.stdout, dir: dir, provider: &provider{path: filepath.Join(dir, providerLog)}}
	if a.json {
		d.out = io.Discard
	}
	d.say("receipts demo: an agent's tool calls, with lost responses, retries, races and a crash\n")
	d.say("store %s (lease TTL %s for the demo; the default is %s)\n", dir, demoLeaseTTL, receipts.DefaultLeaseTTL)
	d.say("provider %s (a naive provider: it performs every call it gets)\n", d.provider.path)

	db, err := d.open()
	if err != nil {
		return err
	}
	if err := d.run(ctx, db); err != nil {
		_ = db.Close()
		return err
	}
	if err := db.Close(); err != nil {
		return err
	}
	db, err = d.crash(ctx)
	if err != nil {
		return err
	}
	restarts, err := d.hostCrash(ctx, db)
	if err != nil {
		_ = db.Close()
		return err
	}
	rep, err := d.report(ctx, db, start)
	if rep != nil {
		rep.HostRestarts = restarts
	}
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if a.json {
		if err := writeJSON(a.stdout, rep); err != nil {
			return err
		}
	} else {
		d.printReport(rep)
	}
	if rep.DuplicateEffects != 0 {
		fmt.Fprintf(a.stderr, "receiptctl: the demo saw %d duplicate effects\n", rep.DuplicateEffects)
		return errProblems
	}
	return nil
}

// demoDir returns the demo's store directory: a new one under the system's
// temporary directory, or dir if it does not exist or is empty.
func demoDir(dir string) (string, error) {
	if dir == "" {
		return os.MkdirTemp("", "receipts-demo-")
	}
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
	case err != nil:
		return "", err
	case len(entries) > 0:
		return "", usagef("demo needs a fresh directory: %s is not empty", dir)
	}
	return filepath.Abs(dir)
}

func (d *demo) say(format string, args ...any) { fmt.Fprintf(d.out, format, args...) }

// open opens the demo's store: default retention, a short lease.
func (d *demo) open() (*receipts.DB, error) {
	return openDemoStore(d.dir, d.a.stderr)
}

func openDemoStore(dir string, stderr io.Writer) (*receipts.DB, error) {
	return receipts.Open(dir, &receipts.Options{
		LeaseTTL:   demoLeaseTTL,
		GCInterval: -1,
		Logger:     slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	})
}

// outcome is what one call of the agent got.
type outcome struct {
	result     string
	state      receipts.State
	performed  bool // the call made the provider perform the effect
	reconciled bool // the call found the effect already performed
	recovered  bool // the call took over an abandoned claim
	attempt    uint32
	err        error // the call's error (a Failed receipt's included)
}

// call makes one tool call through db.Do.
func (d *demo) call(ctx context.Context, db *receipts.DB, c toolCall) outcome {
	d.calls.Add(1)
	var o outcome
	fp, err := c.fingerprint()
	if err != nil {
		o.err = err
		return o
	}
	r, err := db.Do(ctx, c.key(), fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		return d.perform(ctx, l, c, &o)
	})
	o.err = err
	if r != nil {
		o.result, o.state = string(r.Result), r.State
	}
	return o
}

// perform is the body of a tool call: reconcile a recovered claim with the
// provider, else make the provider perform the call.
func (d *demo) perform(ctx context.Context, l *receipts.Lease, c toolCall, o *outcome) ([]byte, error) {
	o.attempt, o.recovered = l.Attempt(), l.Recovered()
	if l.Recovered() {
		conf, ok, err := d.provider.lookup(l.ProviderKey())
		if err != nil {
			return nil, err // still unknown: abandoned again
		}
		if ok {
			o.reconciled = true
			return []byte(conf), nil
		}
	}
	conf, err := d.provider.perform(ctx, l.ProviderKey(), c)
	var declined *declinedError
	switch {
	case errors.As(err, &declined):
		return []byte(declined.reason), receipts.Permanent(err)
	case err != nil:
		return nil, err
	}
	o.performed = true
	return []byte(conf), nil
}

// show describes what a call got.
func (o outcome) show() string {
	switch {
	case errors.Is(o.err, receipts.ErrIntentMismatch):
		return "rejected: same key, different arguments; nothing ran"
	case o.err != nil && o.state == receipts.Failed && o.attempt == 0:
		return fmt.Sprintf("replayed the failed receipt: %s; nothing ran", o.result)
	case o.err != nil && o.state == receipts.Failed:
		return fmt.Sprintf("the provider declined: %s; stored as a failed receipt", o.result)
	case o.err != nil:
		return "error: " + o.err.Error()
	case o.reconciled:
		return fmt.Sprintf("asked the provider by ProviderKey: it already has %s; committed that, not performed again", o.result)
	case o.performed:
		return fmt.Sprintf("ran it: the provider performed it -> %s", o.result)
	}
	return fmt.Sprintf("replayed the receipt -> %s; nothing ran", o.result)
}

// run plays the first four scenes in this process.
func (d *demo) run(ctx context.Context, db *receipts.DB) error {
	d.say("\n1. Lost responses: the agent retries %s\n", bookFlight)
	for i, lost := range []string{"response lost", "response lost", "delivered"} {
		o := d.call(ctx, db, bookFlight)
		if o.err != nil {
			return o.err
		}
		d.say("   call %d  %s  (%s)\n", i+1, o.show(), lost)
	}

	const racers = 4
	d.say("\n2. Racing retries: %d calls at once of %s\n", racers, chargeCard)
	var wg sync.WaitGroup
	outs := make([]outcome, racers)
	startRace := make(chan struct{})
	for i := range outs {
		wg.Go(func() {
			<-startRace
			outs[i] = d.call(ctx, db, chargeCard)
		})
	}
	close(startRace)
	wg.Wait()
	ran, results, err := tally(outs)
	if err != nil {
		return err
	}
	d.say("   %d ran it, %d got its receipt instead of running it: all %d got %s\n",
		ran, racers-ran, racers, strings.Join(sortedKeys(results), ", "))

	d.say("\n3. A key reused with other arguments: %s\n", bookOther)
	if o := d.call(ctx, db, bookOther); !errors.Is(o.err, receipts.ErrIntentMismatch) {
		return fmt.Errorf("reusing a key with other arguments: got %v, want %v", o.err, receipts.ErrIntentMismatch)
	} else {
		d.say("   call 1  %s\n", o.show())
	}

	d.say("\n4. A definitive failure, retried: %s\n", sendEmail)
	for i := range 2 {
		o := d.call(ctx, db, sendEmail)
		if !errors.Is(o.err, receipts.ErrFailed) {
			return fmt.Errorf("a declined call: got %v, want %v", o.err, receipts.ErrFailed)
		}
		d.say("   call %d  %s\n", i+1, o.show())
	}
	return nil
}

// crash plays the fifth scene: the service, in a child process, claims the
// key, makes the provider perform the effect, and is killed before it
// records it; then this process restarts the service (reopens the store)
// and the agent retries. It returns the reopened store.
func (d *demo) crash(ctx context.Context) (*receipts.DB, error) {
	d.say("\n5. A crash mid-action: %s\n", transferOut)
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, exe, "demo-child", "--dir", d.dir)
	cmd.Env = append(os.Environ(), demoChildEnv+"=1")
	cmd.Stderr = d.a.stderr
	providerKey, conf, err := d.runUntilEffect(cmd)
	if err != nil {
		return nil, err
	}
	d.say("   call 1  a child process (pid %d) runs the service: it claims %s, the provider performs it\n", cmd.Process.Pid, transferOut.id)
	d.say("           with idempotency key %s (the lease's ProviderKey) -> %s,\n", short(providerKey), conf)
	d.say("           and the child is killed (%s) before it records the receipt\n", cmd.ProcessState)

	db, err := d.open()
	if err != nil {
		return nil, fmt.Errorf("restart: %w", err)
	}
	if r, err := db.Lookup(ctx, transferOut.key()); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("after the crash: %w", err)
	} else {
		d.say("   restart: %s is %s (attempt %d, lease runs out in %s): its outcome is unknown\n",
			transferOut.id, r.State, r.Attempts, max(time.Until(r.LeaseExpiresAt), 0).Round(time.Millisecond))
	}
	for i, what := range []string{"the agent retries", "and once more"} {
		t0 := time.Now()
		o := d.call(ctx, db, transferOut)
		if o.err != nil {
			_ = db.Close()
			return nil, o.err
		}
		if o.recovered {
			d.say("   call %d  (%s) waited %s for the dead holder's lease, took the claim over (attempt %d, Recovered),\n",
				i+2, what, time.Since(t0).Round(10*time.Millisecond), o.attempt)
			d.say("           %s\n", o.show())
			continue
		}
		d.say("   call %d  %s  (%s)\n", i+2, o.show(), what)
	}
	return db, nil
}

// short abbreviates a provider key for the story.
func short(s string) string {
	if len(s) > 12 {
		return s[:12] + "..."
	}
	return s
}

// report counts calls, effects and receipts.
func (d *demo) report(ctx context.Context, db *receipts.DB, start time.Time) (*demoReport, error) {
	effects, err := d.provider.effects()
	if err != nil {
		return nil, err
	}
	perKey := map[string]int{}
	dups := 0
	for _, e := range effects {
		if perKey[e.IdempotencyKey]++; perKey[e.IdempotencyKey] > 1 {
			dups++
		}
	}
	byState := map[string]int64{}
	for _, s := range []receipts.State{receipts.Succeeded, receipts.Failed, receipts.Pending} {
		byState[s.String()] = 0
	}
	for r, err := range db.Scan(ctx, receipts.Filter{Scope: demoScope}) {
		if err != nil {
			return nil, err
		}
		byState[r.State.String()]++
	}
	return &demoReport{
		Dir:              d.dir,
		ProviderLog:      d.provider.path,
		CallsAttempted:   d.calls.Load(),
		EffectsPerformed: len(effects),
		DuplicateEffects: dups,
		Receipts:         byState,
		LsCommand:        "receiptctl --dir " + shellQuote(d.dir) + " ls",
		Took:             time.Since(start).Round(time.Millisecond).String(),
	}, nil
}

func (d *demo) printReport(rep *demoReport) {
	d.say("\nReport\n")
	tw := newTable(d.out)
	fmt.Fprintf(tw, "  calls attempted\t%d\n", rep.CallsAttempted)
	fmt.Fprintf(tw, "  effects performed\t%d\t(lines in the provider's log)\n", rep.EffectsPerformed)
	fmt.Fprintf(tw, "  duplicate effects\t%d\n", rep.DuplicateEffects)
	fmt.Fprintf(tw, "  host restarts\t%d\t(the agent host, resumed with the keys in its journal)\n", rep.HostRestarts)
	fmt.Fprintf(tw, "  receipts\t%d succeeded, %d failed, %d pending\n",
		rep.Receipts["succeeded"], rep.Receipts["failed"], rep.Receipts["pending"])
	fmt.Fprintf(tw, "  took\t%s\n", rep.Took)
	_ = tw.Flush()
	d.say("\nLook at them: %s\n", rep.LsCommand)
	d.say("and at the host's journal: receiptctl actions %s\n", shellQuote(filepath.Join(rep.Dir, demoHostDir)))
	d.say("(from the repository: go run ./cmd/receiptctl --dir %s ls)\n", shellQuote(rep.Dir))
}

// shellQuote quotes s for a POSIX shell if it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+:@%=,", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// tally counts the racing calls that ran the effect and the results they
// all got; the first error ends it.
func tally(outs []outcome) (ran int, results map[string]int, err error) {
	results = map[string]int{}
	for _, o := range outs {
		if o.err != nil {
			return 0, nil, o.err
		}
		if o.performed {
			ran++
		}
		results[o.result]++
	}
	return ran, results, nil
}

// runUntilEffect starts the demo's child process cmd, reads its output until
// it says it performed the effect, and SIGKILLs it there: no deferred
// function, no Close, nothing recorded. It returns the ProviderKey the child
// claimed with and the confirmation the provider gave it.
func (d *demo) runUntilEffect(cmd *exec.Cmd) (providerKey, conf string, err error) {
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", "", err
	}
	if err := cmd.Start(); err != nil {
		return "", "", fmt.Errorf("start the child process: %w", err)
	}
	d.calls.Add(1)
	sc := bufio.NewScanner(stdout)
	for conf == "" && sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) == 3 && f[0] == "claimed":
			providerKey = f[2]
		case len(f) == 2 && f[0] == "performed":
			conf = f[1]
		}
	}
	if conf == "" {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return "", "", fmt.Errorf("the demo's child process ended before it performed the effect (%v)", sc.Err())
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	return providerKey, conf, nil
}
