package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// versionInfo is what `receiptctl version` reports, from the build
// information the Go toolchain puts in the binary.
type versionInfo struct {
	Module     string `json:"module"`
	Version    string `json:"version"`               // (devel) when built from a work tree
	Commit     string `json:"commit,omitempty"`      // vcs.revision, when the build recorded it
	CommitTime string `json:"commit_time,omitempty"` // vcs.time
	Modified   bool   `json:"modified,omitempty"`    // the work tree had changes
	Go         string `json:"go"`
	Pebble     string `json:"pebble"`
	Pgx        string `json:"pgx"`
}

func buildVersion() versionInfo {
	v := versionInfo{Go: runtime.Version(), Version: "unknown", Pebble: "unknown", Pgx: "unknown"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Module, v.Version = bi.Main.Path, bi.Main.Version
	for _, d := range bi.Deps {
		if d.Replace != nil {
			d = d.Replace
		}
		switch d.Path {
		case "github.com/cockroachdb/pebble/v2":
			v.Pebble = d.Version
		case "github.com/jackc/pgx/v5":
			v.Pgx = d.Version
		}
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.CommitTime = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (a *app) versionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Show receiptctl's version, commit, Go version, and the Pebble and pgx it was built with",
		Long: `version shows the module version receiptctl was built at ("(devel)" when
built from a work tree), the commit and its time when the build recorded
them (go build in a git work tree does; -buildvcs=false does not), the Go
release that built it, and the versions of Pebble and pgx in the binary.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			v := buildVersion()
			if a.json {
				return writeJSON(a.stdout, v)
			}
			tw := newTable(a.stdout)
			fmt.Fprintf(tw, "receiptctl\t%s\n", v.Version)
			if v.Module != "" {
				fmt.Fprintf(tw, "module\t%s\n", v.Module)
			}
			commit := "unknown (not recorded in this build)"
			if v.Commit != "" {
				commit = v.Commit
				if v.CommitTime != "" {
					commit += " (" + v.CommitTime + ")"
				}
				if v.Modified {
					commit += ", with uncommitted changes"
				}
			}
			fmt.Fprintf(tw, "commit\t%s\n", commit)
			fmt.Fprintf(tw, "go\t%s\n", v.Go)
			fmt.Fprintf(tw, "pebble\t%s\n", v.Pebble)
			fmt.Fprintf(tw, "pgx\t%s\n", v.Pgx)
			return tw.Flush()
		},
	}
}
