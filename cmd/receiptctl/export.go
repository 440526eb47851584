package main

import (
	"bufio"
	"encoding/json"

	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/spf13/cobra"
)

func (a *app) exportCmd() *cobra.Command {
	var ff filterFlags
	cmd := &cobra.Command{
		Use:   "export",
		Short: "Write records as JSON lines, one receipt a line, results in base64",
		Long: `export writes every visible record (or those the filters select) to stdout as
JSON lines: one receiptadmin.Receipt a line, results in base64. It shows
progress on stderr when stderr is a terminal. Records that cannot be read
are reported on stderr (exit code 1).`,
		Example: `  receiptctl --dir ./data export > receipts.jsonl
  receiptctl --addr http://127.0.0.1:8081/admin/receipts export --state failed | jq .`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			f, err := ff.filter()
			if err != nil {
				return err
			}
			src, err := a.openSource()
			if err != nil {
				return err
			}
			defer src.close()
			p := a.newProgress("exported")
			bw := bufio.NewWriter(a.stdout)
			enc := json.NewEncoder(bw)
			_, problems, err := src.list(cmd.Context(), f, func(r receiptadmin.Receipt) error {
				p.add()
				return enc.Encode(r)
			})
			p.done()
			if ferr := bw.Flush(); err == nil {
				err = ferr
			}
			if err != nil {
				return err
			}
			return a.reportProblems(problems)
		},
	}
	ff.add(cmd)
	return cmd
}
