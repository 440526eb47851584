package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/spf13/cobra"
)

// Exit codes.
const (
	exitOK      = 0 // done, nothing wrong
	exitProblem = 1 // not found, problems found, or the command failed
	exitUsage   = 2 // bad command line
)

// usageError is a bad command line: exit code 2.
type usageError struct{ error }

func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// errProblems reports that a command printed problems it found (exit 1) and
// has nothing to add.
var errProblems = errors.New("problems found")

// app holds one run's settings and output streams. Nothing in it is shared
// between runs.
type app struct {
	stdout, stderr io.Writer
	started        bool            // a command's RunE was reached: later errors are not usage errors
	ctx            context.Context // the command's context (set when it starts)

	dir      string
	addr     string
	pg       string       // --pg: a PostgreSQL DSN (pgstore)
	priv     privacyFlags // --keyring, --token (privacy.go)
	schema   string       // --schema: the pgstore schema
	json     bool
	settings retentionFlags  // --retention, --override-retention
	src      retentionSource // offline: where the retention in force came from
}

// run runs receiptctl with args (without the program name) and returns its
// exit code. Tests call it in-process.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr, ctx: ctx}
	root := a.rootCmd()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	if errors.Is(err, errProblems) {
		return exitProblem
	}
	var ue usageError
	// Every kind of bad input exits 2: the command line's, and what the
	// store refused as invalid (a key over 255 bytes, a bad filter).
	if !a.started || errors.As(err, &ue) || errors.Is(err, receipts.ErrInvalidArgument) {
		fmt.Fprintf(stderr, "receiptctl: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
		return exitUsage
	}
	fmt.Fprintf(stderr, "receiptctl: %v\n", err)
	return exitProblem
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "receiptctl",
		Short: "Inspect a receipts store: a directory (--dir), PostgreSQL (--pg) or a running service (--addr)",
		Long: `receiptctl shows what a receipts store holds: which operations ran, which
were replayed, and which claims were abandoned with an unknown outcome.

Offline, it opens the store's directory (--dir). A directory that a running
service holds is locked: inspect that service live instead, through the
receiptadmin.Handler it mounts (--addr), or open a copy made with
DB.Checkpoint. Live access is read-only (get, ls, stats, export).

On PostgreSQL (pgstore), --pg DSN opens the store in --schema of that
database, next to the service's running nodes: ls, get, stats, verify, gc and
export work there as on a directory, and so does reconcile.

Results are shown as text when they are printable UTF-8, else as base64.
Exit codes: 0 ok, 1 not found or problems found, 2 bad input (usage, or a
key or filter the store refuses).`,
		Example: `  receiptctl demo
  receiptctl --dir ./data ls --state pending
  receiptctl --pg postgres://app@db/app --schema receipts stats
  receiptctl --addr http://127.0.0.1:8081/admin/receipts stats`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.NoArgs,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			a.started = true
			a.ctx = cmd.Context()
			if err := a.loadPrivacy(); err != nil {
				return err
			}
			for _, name := range []string{"retention", "override-retention"} {
				if f := cmd.Flags().Lookup(name); f != nil && f.Changed && f.Value.String() == "0s" {
					return usagef("--%s 0s: want at least 1ms", name)
				}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.SetOut(a.stderr)
			_ = cmd.Help()
			return usagef("missing command")
		},
	}
	// cobra's completion command: receiptctl completion bash|zsh|fish|powershell.
	root.CompletionOptions.HiddenDefaultCmd = false
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.dir, "dir", "", "store directory (offline; the directory must not be held by a running process)")
	pf.StringVar(&a.pg, "pg", "", "PostgreSQL DSN of a store on pgstore (postgres://user@host:5432/db), without its password: pgx takes that from PGPASSWORD or ~/.pgpass (PGPASSFILE), and what the DSN leaves out from the other libpq variables (PGHOST, PGUSER, PGSSLMODE, ...); default $"+envPG+" when neither --dir nor --addr is given")
	pf.StringVar(&a.schema, "schema", defaultSchema, "with --pg: the schema that holds the store (pgstore.Options.Schema)")
	pf.StringVar(&a.addr, "addr", "", "base URL of a running service's receiptadmin.Handler (live, read-only)")
	pf.BoolVar(&a.json, "json", false, "print JSON for scripts instead of tables")
	a.privacyFlags(root)
	pf.DurationVar(&a.settings.retention, "retention", 0,
		"offline: check that the store records this retention (a store that records another is refused); for a store written by an older version, which records none, the service's Options.Retention (default 24h)")
	pf.DurationVar(&a.settings.override, "override-retention", 0,
		"offline, DANGEROUS: use this retention instead of the one the store records (records older than it look expired; gc drops them for good and records it as the store's retention)")

	root.AddCommand(a.versionCmd(), a.getCmd(), a.lsCmd(), a.statsCmd(), a.gcCmd(), a.verifyCmd(), a.exportCmd(), a.reconcileCmd(), a.actionsCmd(), a.demoCmd(), a.demoChildCmd(), a.demoHostCmd())
	root.AddCommand(a.eraseCmd(), a.erasuresCmd(), a.consoleCmd())
	return root
}

// source is where the read-only commands read from: a store directory, a
// store on PostgreSQL or a running service.
type source interface {
	get(ctx context.Context, k receipts.Key) (receiptadmin.Receipt, error)
	// list calls each for every record f selects, and returns the time of
	// the read and the records that could not be read.
	list(ctx context.Context, f receipts.Filter, each func(receiptadmin.Receipt) error) (now time.Time, problems []string, err error)
	stats(ctx context.Context) (receiptadmin.Stats, error)
	close() error
}

// openSource opens the store named by --dir, --pg or --addr.
func (a *app) openSource() (source, error) {
	if err := a.oneStore(); err != nil {
		return nil, err
	}
	switch {
	case a.addr != "":
		return a.newClient()
	case a.pg != "":
		s, src, err := a.openPG(a.ctx, false)
		if err != nil {
			return nil, err
		}
		a.src = src
		return &offline{db: s.db, src: src, closeFn: s.close}, nil
	case a.dir != "":
		db, src, err := a.openStore()
		if err != nil {
			return nil, err
		}
		a.src = src
		return &offline{db: db, src: src}, nil
	}
	return nil, usagef("give --dir DIR (a store directory), --pg DSN (a store on PostgreSQL) or --addr URL (a service's receiptadmin.Handler)")
}

// oneStore checks that at most one of --dir, --pg and --addr is given.
func (a *app) oneStore() error {
	n := 0
	for _, s := range []string{a.dir, a.pg, a.addr} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		return usagef("give one of --dir, --pg and --addr")
	}
	return nil
}

// needDir checks that the command runs on a store it opens itself: a
// directory or PostgreSQL.
func (a *app) needDir(cmd string) error {
	if err := a.oneStore(); err != nil {
		return err
	}
	switch {
	case a.addr != "":
		return usagef("%s works on a store directory (--dir) or PostgreSQL (--pg) only: the admin endpoint is read-only", cmd)
	case a.dir == "" && a.pg == "":
		return usagef("%s needs --dir DIR or --pg DSN", cmd)
	}
	return nil
}

// lockedError explains how to inspect a store that a running process holds.
type lockedError struct {
	dir string
	err error
}

func (e *lockedError) Error() string {
	return fmt.Sprintf(`%s is held by a running process (the store is locked).
Inspect that service live with --addr instead, pointed at the URL where it mounts
receiptadmin.Handler (for example: receiptctl --addr http://127.0.0.1:8081/admin/receipts ls),
or make a copy with DB.Checkpoint and open the checkpoint: receiptctl --dir CHECKPOINT_DIR ls`, e.dir)
}

func (e *lockedError) Unwrap() error { return e.err }

// openStore opens --dir read-only, with the retention the store records
// (see retentionFlags). Read-only opens never change the store (a directory
// that holds no store is reported, not created).
func (a *app) openStore() (*receipts.DB, retentionSource, error) {
	return openResolved(a.dir, a.settings, true, false, false, a.stderr)
}

// checkStoreDir reports a dir that holds no store, so that receiptctl never
// creates one where there was none.
func checkStoreDir(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("no store at %s: the directory does not exist", dir)
	case err != nil:
		return err
	case !fi.IsDir():
		return fmt.Errorf("no store at %s: not a directory", dir)
	}
	if !looksLikeStore(dir) {
		return fmt.Errorf("no store at %s: the directory holds no Pebble store", dir)
	}
	return nil
}

func newLogger(stderr io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// looksLikeStore reports whether dir holds a Pebble store (a manifest), so
// that receiptctl never creates one where there was none.
func looksLikeStore(dir string) bool {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "MANIFEST-") || strings.HasPrefix(e.Name(), "marker.manifest.") {
			return true
		}
	}
	return false
}

// offline reads a store that receiptctl opened: a directory, or PostgreSQL.
type offline struct {
	db      *receipts.DB
	src     retentionSource // where the retention in force came from
	closeFn func() error    // closes db and what it runs on; nil: db.Close
}

func (o *offline) get(ctx context.Context, k receipts.Key) (receiptadmin.Receipt, error) {
	r, err := o.db.Lookup(ctx, k)
	if err != nil {
		return receiptadmin.Receipt{}, err
	}
	a := receiptadmin.NewReceipt(r, time.Now())
	steps, err := o.db.Steps(ctx, k) // the key's step journal (Lease.Step)
	if err != nil {
		return receiptadmin.Receipt{}, err
	}
	a.Steps = receiptadmin.NewSteps(steps, a.Abandoned)
	return a, nil
}

func (o *offline) list(ctx context.Context, f receipts.Filter, each func(receiptadmin.Receipt) error) (time.Time, []string, error) {
	now := time.Now()
	var problems []string
	for r, err := range o.db.Scan(ctx, f) {
		if err != nil {
			if errors.Is(err, receipts.ErrInvalidArgument) {
				return now, problems, usageError{err}
			}
			if ctx.Err() != nil {
				return now, problems, err
			}
			problems = append(problems, err.Error())
			continue
		}
		if err := each(receiptadmin.NewReceipt(r, now)); err != nil {
			return now, problems, err
		}
	}
	return now, problems, nil
}

func (o *offline) stats(ctx context.Context) (receiptadmin.Stats, error) {
	c, err := o.db.Count(ctx)
	if err != nil {
		return receiptadmin.Stats{}, err
	}
	s := receiptadmin.NewStats(o.db.Stats(), c, time.Now())
	if o.src != fromStore {
		s.LeaseTTL = "" // receiptctl's own, not the service's
	}
	return s, nil
}

func (o *offline) close() error {
	if o.closeFn != nil {
		return o.closeFn()
	}
	return o.db.Close()
}

// notFound reports whether err means "no such record".
func notFound(err error) bool { return errors.Is(err, receipts.ErrNotFound) }
