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

	"github.com/cockroachdb/pebble/v2"
	"github.com/receiptstore/receipts"
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
	started        bool // a command's RunE was reached: later errors are not usage errors

	dir       string
	addr      string
	json      bool
	retention time.Duration
}

// run runs receiptctl with args (without the program name) and returns its
// exit code. Tests call it in-process.
func run(args []string, stdout, stderr io.Writer) int {
	return runContext(context.Background(), args, stdout, stderr)
}

func runContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr}
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
	if !a.started || errors.As(err, &ue) {
		fmt.Fprintf(stderr, "receiptctl: %v\nRun '%s --help' for usage.\n", err, cmd.CommandPath())
		return exitUsage
	}
	fmt.Fprintf(stderr, "receiptctl: %v\n", err)
	return exitProblem
}

func (a *app) rootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:   "receiptctl",
		Short: "Inspect a receipts store, offline (--dir) or in a running service (--addr)",
		Long: `receiptctl shows what a receipts store holds: which operations ran, which
were replayed, and which claims were abandoned with an unknown outcome.

Offline, it opens the store's directory (--dir). A directory that a running
service holds is locked: inspect that service live instead, through the
receipts.AdminHandler it mounts (--addr), or open a copy made with
DB.Checkpoint. Live access is read-only (get, ls, stats, export).

Results are shown as text when they are printable UTF-8, else as base64.
Exit codes: 0 ok, 1 not found or problems found, 2 usage.`,
		Example: `  receiptctl demo
  receiptctl --dir ./data ls --state pending
  receiptctl --addr http://127.0.0.1:8081/admin/receipts stats`,
		SilenceErrors: true,
		SilenceUsage:  true,
		Args:          cobra.NoArgs,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			a.started = true
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.SetOut(a.stderr)
			_ = cmd.Help()
			return usagef("missing command")
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&a.dir, "dir", "", "store directory (offline; the directory must not be held by a running process)")
	pf.StringVar(&a.addr, "addr", "", "base URL of a running service's receipts.AdminHandler (live, read-only)")
	pf.BoolVar(&a.json, "json", false, "print JSON for scripts instead of tables")
	pf.DurationVar(&a.retention, "retention", receipts.DefaultRetention,
		"the service's Options.Retention (offline; the store does not record it): older records are expired")

	root.AddCommand(a.getCmd(), a.lsCmd(), a.statsCmd(), a.gcCmd(), a.verifyCmd(), a.exportCmd(), a.demoCmd(), a.demoChildCmd())
	return root
}

// source is where the read-only commands read from: a store directory or a
// running service.
type source interface {
	get(ctx context.Context, k receipts.Key) (receipts.AdminReceipt, error)
	// list calls each for every record f selects, and returns the time of
	// the read and the records that could not be read.
	list(ctx context.Context, f receipts.Filter, each func(receipts.AdminReceipt) error) (now time.Time, problems []string, err error)
	stats(ctx context.Context) (receipts.AdminStats, error)
	close() error
}

// openSource opens the store named by --dir or --addr.
func (a *app) openSource() (source, error) {
	switch {
	case a.dir != "" && a.addr != "":
		return nil, usagef("give --dir or --addr, not both")
	case a.addr != "":
		return newClient(a.addr)
	case a.dir != "":
		db, err := a.openStore(true)
		if err != nil {
			return nil, err
		}
		return &offline{db: db}, nil
	}
	return nil, usagef("give --dir DIR (a store directory) or --addr URL (a service's receipts.AdminHandler)")
}

// needDir checks that the command runs on a directory.
func (a *app) needDir(cmd string) error {
	switch {
	case a.addr != "":
		return usagef("%s works on a store directory (--dir) only: the admin endpoint is read-only", cmd)
	case a.dir == "":
		return usagef("%s needs --dir DIR", cmd)
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
receipts.AdminHandler (for example: receiptctl --addr http://127.0.0.1:8081/admin/receipts ls),
or make a copy with DB.Checkpoint and open the checkpoint: receiptctl --dir CHECKPOINT_DIR ls`, e.dir)
}

func (e *lockedError) Unwrap() error { return e.err }

// openStore opens --dir. Read-only opens never change the store (a
// directory that holds no store is reported, not created).
func (a *app) openStore(readOnly bool) (*receipts.DB, error) {
	return openStoreOpts(a.dir, a.retention, readOnly, false, a.stderr)
}

// openStoreOpts opens the store in dir for receiptctl: no background GC,
// warnings to stderr, CompactOnGC as given.
func openStoreOpts(dir string, retention time.Duration, readOnly, compact bool, stderr io.Writer) (*receipts.DB, error) {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("no store at %s: the directory does not exist", dir)
	case err != nil:
		return nil, err
	case !fi.IsDir():
		return nil, fmt.Errorf("no store at %s: not a directory", dir)
	}
	if !looksLikeStore(dir) {
		return nil, fmt.Errorf("no store at %s: the directory holds no Pebble store", dir)
	}
	if retention < time.Millisecond {
		return nil, usagef("--retention %s: want at least 1ms", retention)
	}
	opts := &receipts.Options{
		Retention:   retention,
		LeaseTTL:    min(receipts.DefaultLeaseTTL, retention/2),
		GCInterval:  -1,
		CompactOnGC: compact,
		Logger:      slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Pebble:      &pebble.Options{ReadOnly: readOnly},
	}
	db, err := receipts.Open(dir, opts)
	switch {
	case errors.Is(err, receipts.ErrLocked):
		return nil, &lockedError{dir: dir, err: err}
	case err != nil && readOnly && !errors.Is(err, receipts.ErrCorrupt) && !errors.Is(err, receipts.ErrUnknownFormat):
		return nil, fmt.Errorf("cannot open a store at %s (is it a receipts store?): %w", dir, err)
	case err != nil:
		return nil, err
	}
	return db, nil
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

// offline reads a store directory.
type offline struct{ db *receipts.DB }

func (o *offline) get(ctx context.Context, k receipts.Key) (receipts.AdminReceipt, error) {
	r, err := o.db.Lookup(ctx, k)
	if err != nil {
		return receipts.AdminReceipt{}, err
	}
	return receipts.NewAdminReceipt(r, time.Now()), nil
}

func (o *offline) list(ctx context.Context, f receipts.Filter, each func(receipts.AdminReceipt) error) (time.Time, []string, error) {
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
		if err := each(receipts.NewAdminReceipt(r, now)); err != nil {
			return now, problems, err
		}
	}
	return now, problems, nil
}

func (o *offline) stats(context.Context) (receipts.AdminStats, error) {
	s := receipts.NewAdminStats(o.db.Stats(), time.Now())
	s.LeaseTTL = "" // receiptctl's own, not the service's: the store does not record it
	return s, nil
}

func (o *offline) close() error { return o.db.Close() }

// notFound reports whether err means "no such record".
func notFound(err error) bool { return errors.Is(err, receipts.ErrNotFound) }
