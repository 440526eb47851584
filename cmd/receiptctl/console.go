package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os/user"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptconsole"
	"github.com/receiptstore/receipts/receiptconsole/consoleintents"
	"github.com/spf13/cobra"
)

func (a *app) consoleCmd() *cobra.Command {
	var (
		listen      string
		readOnly    bool
		showResults bool
		journalDir  string
		journalPG   string
	)
	cmd := &cobra.Command{
		Use:   "console --dir DIR | --pg DSN",
		Short: "Serve the operators' console (web pages) on a store, offline",
		Long: `console serves the operators' console (package receiptconsole) on a store
directory (--dir; the service must not hold it) or on PostgreSQL (--pg, next to
the service's running nodes), and prints the address to open in a browser.

The console shows the store's state, the abandoned claims that need a person
(oldest first, with their provider keys), one key's record, and the erasure
ledger; it settles an abandoned claim in its front end's form (as reconcile
does), and erases a scope, each behind a typed confirmation. Every change is
logged on stderr with who made it (the user running receiptctl).

It listens on --addr (here the address to listen on, default 127.0.0.1:0: a
free port on loopback) and answers loopback only. Results stay hidden unless --show-results is given;
--read-only refuses every change. Ctrl-C stops it.

With --journal DIR (a host's journal directory, package intents; the host must
not hold it) or, on --pg, --journal-schema SCHEMA (a journal in that schema of
the same database), its Host half page lists the journal's uncertain, expired
and conflicting actions, to redeliver, settle or forget.`,
		Example: `  receiptctl --dir ./data console
  receiptctl --pg postgres://ops@db/app console --addr 127.0.0.1:8099 --read-only`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.needDir("console"); err != nil {
				return err
			}
			ctx := cmd.Context()
			db, closeDB, err := a.openWritable(ctx)
			if err != nil {
				return err
			}
			defer closeDB()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("console: %w", err)
			}
			if journalDir != "" && journalPG != "" {
				return usagef("give --journal DIR or --journal-schema SCHEMA, not both")
			}
			if journalPG != "" && a.pg == "" {
				return usagef("--journal-schema opens a journal on PostgreSQL: give --pg")
			}
			var journal receiptconsole.Journal
			if journalDir != "" || journalPG != "" {
				var args []string
				if journalDir != "" {
					args = []string{journalDir}
				}
				j, closeJournal, err := a.openJournal(ctx, args, journalPG)
				if err != nil {
					return err
				}
				defer closeJournal()
				journal = consoleintents.Journal(j)
			}
			who := "receiptctl console"
			if u, err := user.Current(); err == nil {
				who += " (" + u.Username + ")"
			}
			opts := &receiptconsole.Options{
				ReadOnly: readOnly,
				Journal:  journal,
				Operator: func(*http.Request) string { return who },
				Logger:   slog.New(slog.NewTextHandler(a.stderr, nil)),
			}
			if showResults {
				opts.ShowResult = func(*http.Request, *receipts.Receipt) error { return nil }
			}
			srv := &http.Server{Handler: receiptconsole.Handler(db, opts), ReadHeaderTimeout: 10 * time.Second}
			served := make(chan error, 1)
			go func() { served <- srv.Serve(ln) }()
			fmt.Fprintf(a.stdout, "receipts console on %s: open http://%s/\n(Ctrl-C stops it)\n", db.Driver().Name(), ln.Addr())
			select {
			case <-ctx.Done():
			case err = <-served:
				return fmt.Errorf("console: %w", err)
			}
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil {
				_ = srv.Close()
			}
			if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("console: %w", err)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&listen, "addr", "127.0.0.1:0", "the address to listen on (host:port; port 0 picks a free one)")
	cmd.Flags().BoolVar(&readOnly, "read-only", false, "refuse every change (settle, erase)")
	cmd.Flags().StringVar(&journalDir, "journal", "", "a host's journal directory (package intents), for the Host half page")
	cmd.Flags().StringVar(&journalPG, "journal-schema", "", "with --pg: the schema of a host's journal, for the Host half page")
	cmd.Flags().BoolVar(&showResults, "show-results", false, "show stored results (hidden by default)")
	return cmd
}
