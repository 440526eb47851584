//go:build ignore

// vulndb writes a Go vulnerability database that govulncheck reads with
// -db file://DIR, from the OSV entries of the golang.org/x/vulndb module
// (its data/osv folder), as vuln.go.dev serves it: index/db.json,
// index/modules.json, index/vulns.json and ID/GO-YYYY-NNNN.json. The
// modules index leaves out each vulnerability's "fixed" version (optional
// in the format), so govulncheck reads the entry of every vulnerability of
// a module the build uses and decides from its ranges.
//
//	go run scripts/vulndb.go -osv $(go mod download -json golang.org/x/vulndb@VERSION | ...)/data/osv -out DIR
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

type entry struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	Aliases  []string  `json:"aliases,omitempty"`
	Affected []struct {
		Module struct {
			Path string `json:"name"`
		} `json:"package"`
	} `json:"affected"`
}

type moduleVuln struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
}

type module struct {
	Path  string       `json:"path"`
	Vulns []moduleVuln `json:"vulns"`
}

type vuln struct {
	ID       string    `json:"id"`
	Modified time.Time `json:"modified"`
	Aliases  []string  `json:"aliases,omitempty"`
}

func main() {
	osvDir := flag.String("osv", "", "folder of OSV JSON files (golang.org/x/vulndb's data/osv)")
	out := flag.String("out", "", "folder to write the database to")
	flag.Parse()
	if *osvDir == "" || *out == "" {
		fmt.Fprintln(os.Stderr, "usage: go run scripts/vulndb.go -osv DIR -out DIR")
		os.Exit(2)
	}
	if err := write(*osvDir, *out); err != nil {
		fmt.Fprintln(os.Stderr, "vulndb:", err)
		os.Exit(1)
	}
}

func write(osvDir, out string) error {
	files, err := filepath.Glob(filepath.Join(osvDir, "GO-*.json"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no GO-*.json files in %s", osvDir)
	}
	for _, d := range []string{"index", "ID"} {
		if err := os.MkdirAll(filepath.Join(out, d), 0o755); err != nil {
			return err
		}
	}
	var modified time.Time
	modules := map[string]*module{}
	var vulns []vuln
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var e entry
		if err := json.Unmarshal(b, &e); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if e.ID != strings.TrimSuffix(filepath.Base(f), ".json") {
			return fmt.Errorf("%s holds %q", f, e.ID)
		}
		if e.Modified.After(modified) {
			modified = e.Modified
		}
		vulns = append(vulns, vuln{ID: e.ID, Modified: e.Modified, Aliases: e.Aliases})
		for _, a := range e.Affected {
			m := modules[a.Module.Path]
			if m == nil {
				m = &module{Path: a.Module.Path}
				modules[a.Module.Path] = m
			}
			if !slices.ContainsFunc(m.Vulns, func(v moduleVuln) bool { return v.ID == e.ID }) {
				m.Vulns = append(m.Vulns, moduleVuln{ID: e.ID, Modified: e.Modified})
			}
		}
		if err := os.WriteFile(filepath.Join(out, "ID", e.ID+".json"), b, 0o644); err != nil {
			return err
		}
	}
	var mods []*module
	for _, m := range modules {
		mods = append(mods, m)
	}
	slices.SortFunc(mods, func(a, b *module) int { return strings.Compare(a.Path, b.Path) })
	slices.SortFunc(vulns, func(a, b vuln) int { return strings.Compare(a.ID, b.ID) })
	for name, v := range map[string]any{
		"db.json":      map[string]time.Time{"modified": modified},
		"modules.json": mods,
		"vulns.json":   vulns,
	} {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(out, "index", name), b, 0o644); err != nil {
			return err
		}
	}
	fmt.Fprintf(os.Stderr, "vulndb: %d entries, %d modules -> %s\n", len(vulns), len(mods), out)
	return nil
}
