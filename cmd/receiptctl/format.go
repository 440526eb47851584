package main

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptadmin"
	"github.com/spf13/cobra"
)

// newTable returns a writer that aligns tab-separated columns; Flush it.
func newTable(w io.Writer) *tabwriter.Writer { return tabwriter.NewWriter(w, 0, 0, 2, ' ', 0) }

// printable reports whether b is UTF-8 text without control characters
// (newlines and tabs allowed if multiline).
func printable(b []byte, multiline bool) bool {
	if !utf8.Valid(b) {
		return false
	}
	for _, r := range string(b) {
		if multiline && (r == '\n' || r == '\t') {
			continue
		}
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// showBytes renders a result for a table cell: text when printable, else
// "base64:..."; at most max runes (0: no limit).
func showBytes(b []byte, max int) string {
	var s string
	switch {
	case b == nil:
		return "-"
	case len(b) == 0:
		return `""`
	case printable(b, false):
		s = string(b)
	default:
		s = "base64:" + base64.StdEncoding.EncodeToString(b)
	}
	if max > 0 && utf8.RuneCountInString(s) > max {
		r := []rune(s)
		s = string(r[:max-1]) + "…"
	}
	return s
}

// showKeyPart renders a scope or ID as stored, quoted (Go syntax) only if it
// is not printable (a hashed key: "\x00h…") or starts with a double quote, so
// that keyArg reads every form shown back as the key it shows.
func showKeyPart(s string) string {
	if s != "" && s[0] != '"' && printable([]byte(s), false) {
		return s
	}
	return strconv.Quote(s)
}

// keyArg reads a scope or ID given on the command line (what names it in
// errors): as given, or, in double quotes, as the Go string literal that ls,
// reconcile and get show for a key part that is not printable (showKeyPart),
// such as a hashed key (Options.HashKeys), whose NUL byte cannot be typed.
func keyArg(what, s string) (string, error) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s, nil
	}
	u, err := strconv.Unquote(s)
	if err != nil {
		return "", usagef("%s %s: a quoted key part is read as a Go string literal, as ls shows it: %v", what, s, err)
	}
	return u, nil
}

// keyArgs reads SCOPE and ID given on the command line (keyArg).
func keyArgs(scope, id string) (receipts.Key, error) {
	s, err := keyArg("SCOPE", scope)
	if err != nil {
		return receipts.Key{}, err
	}
	i, err := keyArg("ID", id)
	if err != nil {
		return receipts.Key{}, err
	}
	return receipts.Key{Scope: s, ID: i}, nil
}

// showTime renders a time for people, in the local zone.
func showTime(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format("2006-01-02 15:04:05.000")
}

// showLease describes a record's lease at now.
func showLease(r *receiptadmin.Receipt, now time.Time) string {
	switch {
	case r.State != receipts.Pending.String():
		return "-"
	case r.Abandoned || !now.Before(r.LeaseExpiresAt):
		return "expired"
	}
	return "live " + r.LeaseExpiresAt.Sub(now).Round(time.Millisecond).String()
}

// showSize renders a byte count for people.
func showSize(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// writeJSON prints v as indented JSON.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progress counts records on stderr, only when stderr is a terminal, at
// most ten times a second.
type progress struct {
	w     io.Writer // nil: off
	label string
	n     int
	last  time.Time
}

func (a *app) newProgress(label string) *progress {
	p := &progress{label: label}
	if isTerminal(a.stderr) {
		p.w = a.stderr
	}
	return p
}

func (p *progress) add() {
	p.n++
	if p.w == nil {
		return
	}
	if now := time.Now(); now.Sub(p.last) >= 100*time.Millisecond {
		p.last = now
		fmt.Fprintf(p.w, "\r%s %d records...", p.label, p.n)
	}
}

// done clears the progress line.
func (p *progress) done() {
	if p.w != nil && !p.last.IsZero() {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

// filterFlags are the record filters of ls and export (receipts.Filter).
type filterFlags struct {
	scope     string
	state     string
	abandoned bool
	limit     int
}

func (f *filterFlags) add(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.scope, "scope", "", "only records of this scope")
	fl.StringVar(&f.state, "state", "", "only records in this state: pending, succeeded or failed")
	fl.BoolVar(&f.abandoned, "abandoned", false, "only pending claims whose lease ran out (outcomes to reconcile)")
	fl.IntVar(&f.limit, "limit", 0, "at most this many records (0: all)")
}

func (f *filterFlags) filter() (receipts.Filter, error) {
	st, err := receipts.ParseState(f.state)
	if err != nil {
		return receipts.Filter{}, usagef("--state %q: want pending, succeeded or failed", f.state)
	}
	if f.limit < 0 {
		return receipts.Filter{}, usagef("--limit must not be negative")
	}
	if len(f.scope) > receipts.MaxKeyPartLen {
		return receipts.Filter{}, usagef("--scope longer than %d bytes", receipts.MaxKeyPartLen)
	}
	return receipts.Filter{Scope: f.scope, State: st, Abandoned: f.abandoned, Limit: f.limit}, nil
}

// reportProblems prints problems to stderr, one a line, and returns
// errProblems if there are any.
func (a *app) reportProblems(problems []string) error {
	for _, p := range problems {
		fmt.Fprintf(a.stderr, "receiptctl: problem: %s\n", p)
	}
	if len(problems) > 0 {
		fmt.Fprintf(a.stderr, "receiptctl: %d %s could not be read (run receiptctl verify on the directory)\n",
			len(problems), plural(len(problems), "record", "records"))
		return errProblems
	}
	return nil
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// indent prefixes every line of s but the first with pad.
func indent(s, pad string) string { return strings.ReplaceAll(s, "\n", "\n"+pad) }
