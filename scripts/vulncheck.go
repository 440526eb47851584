//go:build ignore

// vulncheck reads govulncheck's JSON (-format json) on stdin and decides
// for CI. It fails when a module the build requires has a known
// vulnerability with a fixed version (raise the requirement), whether or
// not receipts' code calls it. Standard-library findings are listed with
// the Go release that fixes them and do not fail: they are fixed by the
// toolchain a program is built with, not by this module's requirements.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
)

type frame struct {
	Module   string `json:"module"`
	Version  string `json:"version"`
	Package  string `json:"package"`
	Function string `json:"function"`
}

type message struct {
	Finding *struct {
		OSV          string  `json:"osv"`
		FixedVersion string  `json:"fixed_version"`
		Trace        []frame `json:"trace"`
	} `json:"finding"`
	OSV *struct {
		ID      string `json:"id"`
		Summary string `json:"summary"`
	} `json:"osv"`
}

type finding struct {
	id, module, version, fixed, summary string
	called                              bool
}

func main() {
	dec := json.NewDecoder(os.Stdin)
	summaries := map[string]string{}
	found := map[string]*finding{}
	for {
		var m message
		err := dec.Decode(&m)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "vulncheck: reading govulncheck's output:", err)
			os.Exit(2)
		}
		if m.OSV != nil {
			summaries[m.OSV.ID] = m.OSV.Summary
		}
		if f := m.Finding; f != nil && len(f.Trace) > 0 {
			k := f.OSV + " " + f.Trace[0].Module
			x := found[k]
			if x == nil {
				x = &finding{id: f.OSV, module: f.Trace[0].Module, version: f.Trace[0].Version, fixed: f.FixedVersion}
				found[k] = x
			}
			x.called = x.called || f.Trace[0].Function != ""
		}
	}
	var keys []string
	for k := range found {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	failed, std := 0, 0
	for _, k := range keys {
		f := found[k]
		how := "required, not called"
		if f.called {
			how = "called"
		}
		fixed := f.fixed
		if fixed == "" {
			fixed = "no fix yet"
		}
		line := fmt.Sprintf("%s %s@%s (%s; fixed in %s): %s", f.id, f.module, f.version, how, fixed, summaries[f.id])
		switch {
		case f.module == "stdlib":
			std++
			fmt.Println("standard library:", line)
		case f.fixed != "":
			failed++
			fmt.Println("FAIL:", line)
		default:
			fmt.Println("no fix:", line)
		}
	}
	if std > 0 {
		fmt.Printf("%d standard-library findings for %s: build releases with a Go that fixes them (the newest \"fixed in\" above).\n", std, runtime.Version())
	}
	if failed > 0 {
		fmt.Printf("%d findings in required modules have a fixed version: raise them (go get MODULE@VERSION, in the root and bench/ modules).\n", failed)
		os.Exit(1)
	}
	fmt.Println("vulncheck: no required module has a known, fixed vulnerability")
}
