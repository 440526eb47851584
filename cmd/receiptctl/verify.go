package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/receiptstore/receipts"
	"github.com/spf13/cobra"
)

// verifyReport is what verify found; --json prints it.
type verifyReport struct {
	Dir          string          `json:"dir"`
	OK           bool            `json:"ok"`
	Records      int             `json:"records"` // record keys checked
	Epochs       int             `json:"epochs"`  // distinct epochs holding records
	Expired      int             `json:"expired"` // past the store's retention, waiting for GC
	EpochWidth   string          `json:"epoch_width,omitempty"`
	GCFloor      uint64          `json:"gc_floor"`
	TokenCeiling uint64          `json:"token_ceiling"`
	Problems     []verifyProblem `json:"problems"`
}

// verifyProblem is one thing wrong with one stored key.
type verifyProblem struct {
	// Key is the record's key ("scope"/"id", Go-quoted) or, for a key that
	// does not parse, the raw key, Go-quoted.
	Key     string  `json:"key"`
	Epoch   *uint64 `json:"epoch,omitempty"`
	Problem string  `json:"problem"`
}

func (a *app) verifyCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "verify",
		Short: "Check that every record decodes and sits in a valid epoch, and that meta is sane",
		Long: `verify reads every key of a store directory and checks that the meta record,
token ceiling and GC floor decode and are sane; that every record key parses,
sits in an epoch not below the GC floor and at most one epoch ahead of now,
matching the record's last write; that every record decodes (version,
checksum, fields), holds a token below the token ceiling, and that no key is
stored in two epochs. It prints the problems and exits with code 1 if there
are any. It works offline only (it reads the raw keys).`,
		Example: `  receiptctl --dir ./data verify
  receiptctl --dir ./data verify --json | jq '.problems[]'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.needDir("verify"); err != nil {
				return err
			}
			if a.pg != "" {
				return a.verifyPG(cmd.Context())
			}
			rep := &verifyReport{Dir: a.dir, Problems: []verifyProblem{}}
			db, _, err := a.openStore()
			switch {
			case errors.Is(err, receipts.ErrCorrupt), errors.Is(err, receipts.ErrUnknownFormat):
				// The store refuses to open: that is the finding.
				rep.Problems = append(rep.Problems, verifyProblem{Key: "store", Problem: err.Error()})
			case err != nil:
				return err
			default:
				err = a.verify(cmd.Context(), db, rep)
				if cerr := db.Close(); err == nil {
					err = cerr
				}
				if err != nil {
					return err
				}
			}
			return a.finishVerify(rep)
		},
	}
}

// verify runs db.Check into rep.
func (a *app) verify(ctx context.Context, db *receipts.DB, rep *verifyReport) error {
	t := a.startTicker("verifying")
	c, err := db.Check(receipts.WithProgress(ctx, t.set))
	t.end()
	if err != nil {
		return err
	}
	rep.Records, rep.Epochs, rep.Expired = c.Records, c.Epochs, c.Expired
	if c.EpochWidth > 0 {
		rep.EpochWidth = c.EpochWidth.String()
	}
	rep.GCFloor, rep.TokenCeiling = c.GCFloor, c.TokenCeiling
	for _, p := range c.Problems {
		vp := verifyProblem{Key: p.Key, Problem: p.What}
		if p.Epoch >= 0 {
			e := uint64(p.Epoch)
			vp.Epoch = &e
		}
		rep.Problems = append(rep.Problems, vp)
	}
	return nil
}

func (a *app) printVerify(rep *verifyReport) {
	summary := fmt.Sprintf("%d %s in %d %s (epoch width %s, GC floor %d, token ceiling %d, %d expired)",
		rep.Records, plural(rep.Records, "record", "records"), rep.Epochs, plural(rep.Epochs, "epoch", "epochs"),
		rep.EpochWidth, rep.GCFloor, rep.TokenCeiling, rep.Expired)
	if rep.OK {
		fmt.Fprintf(a.stdout, "ok: %s, meta sane\n", summary)
		return
	}
	fmt.Fprintf(a.stdout, "%d %s in %s\n", len(rep.Problems), plural(len(rep.Problems), "problem", "problems"), summary)
	tw := newTable(a.stdout)
	fmt.Fprintln(tw, "KEY\tEPOCH\tPROBLEM")
	for _, p := range rep.Problems {
		epoch := "-"
		if p.Epoch != nil {
			epoch = strconv.FormatUint(*p.Epoch, 10)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\n", p.Key, epoch, p.Problem)
	}
	_ = tw.Flush()
}
