package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/spf13/cobra"
)

// demoChildCmd is the demo's service process that crashes: it claims the
// transfer, makes the provider perform it, says so on stdout, and waits to be
// killed. Hidden; it runs only with demoChildEnv set.
func (a *app) demoChildCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "demo-child",
		Short:   "The demo's crashing service process (internal)",
		Example: "  (run by receiptctl demo only)",
		Hidden:  true,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Getenv(demoChildEnv) != "1" || a.dir == "" {
				return usagef("demo-child is run by the demo only")
			}
			return a.demoChild(cmd.Context())
		},
	}
}

func (a *app) demoChild(ctx context.Context) error {
	var db *receipts.DB
	if a.pg != "" { // demo --pg: a third node on the shared database
		n, err := openDemoNode(ctx, "C", a.pg, a.schema, a.stderr)
		if err != nil {
			return err
		}
		defer n.close()
		db = n.db
	} else {
		var err error
		if db, err = openDemoStore(a.dir, a.stderr); err != nil {
			return err
		}
		defer db.Close()
	}
	p := &provider{path: filepath.Join(a.dir, providerLog)}
	fp, err := transferOut.fingerprint()
	if err != nil {
		return err
	}
	_, err = db.Do(ctx, transferOut.key(), fp, func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		fmt.Fprintf(a.stdout, "claimed %d %s\n", l.Attempt(), l.ProviderKey())
		conf, err := p.perform(ctx, l.ProviderKey(), transferOut)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(a.stdout, "performed %s\n", conf)
		// Wait for the SIGKILL. If it does not come, give up: the claim is
		// abandoned, the outcome still unknown.
		select {
		case <-time.After(demoTimeout):
		case <-ctx.Done():
		}
		return nil, errors.New("the demo did not kill its child process")
	})
	return err
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
