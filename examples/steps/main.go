// Command steps books trips of three steps (reserve a seat, charge a card,
// notify the traveller) with receipts.Lease.Step, and shows a retry resume
// the work after the process is killed between two steps, and again inside
// a step. Each step forwards its Step.ProviderKey to a provider that
// deduplicates by it (its log is a file, so it outlives the process).
//
//	go run ./examples/steps [-dir DIR]
//
// The story runs the booking service as a child process (this program,
// re-executed) and SIGKILLs it twice; see README.md.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/receiptstore/receipts"
)

// The child's environment: the directory, the trip (the operation key) and
// where it dies ("" not at all, "before:STEP" before STEP starts, "in:STEP"
// inside STEP, once the provider did its effect).
const (
	envChild = "RECEIPTS_STEPS_CHILD"
	envTrip  = "RECEIPTS_STEPS_TRIP"
	envDie   = "RECEIPTS_STEPS_DIE"
)

// killMe is the line a child prints where it wants to be killed; the
// parent does not show it.
const killMe = "@kill-me"

type options struct{ dir string }

func main() {
	if dir := os.Getenv(envChild); dir != "" {
		if err := serve(dir, os.Getenv(envTrip), os.Getenv(envDie), os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "steps (booking service):", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.StringVar(&o.dir, "dir", "", "the directory of the store and the provider's log (default: a temporary one)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, o); err != nil {
		fmt.Fprintln(os.Stderr, "steps:", err)
		os.Exit(1)
	}
}

// run plays the story: two trips, each cut once by a SIGKILL, then retried.
func run(ctx context.Context, w io.Writer, o options) error {
	if o.dir == "" {
		tmp, err := os.MkdirTemp("", "receipts-steps")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		o.dir = tmp
	}
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	type life struct {
		trip, die, title, killed string
	}
	for _, l := range []life{
		{"trip-1", "before:notify", "book trip-1", "the service dies between charge and notify"},
		{"trip-1", "", "retry trip-1 (same key)", ""},
		{"trip-1", "", "retry trip-1 again", ""},
		{"trip-2", "in:notify", "book trip-2", "the provider sent the itinerary; the service dies before notify's outcome is recorded"},
		{"trip-2", "", "retry trip-2 (same key)", ""},
	} {
		say("\n== %s ==", l.title)
		if err := child(ctx, w, o.dir, l.trip, l.die); err != nil {
			return err
		}
		if l.killed != "" {
			say("== SIGKILL: %s (provider effects: %d) ==", l.killed, len(readProvider(o.dir)))
		}
	}

	// What the store and the provider hold, read afterwards.
	db, err := openStore(o.dir)
	if err != nil {
		return err
	}
	defer db.Close()
	say("\n== afterwards ==")
	for _, trip := range []string{"trip-1", "trip-2"} {
		steps, err := db.Steps(ctx, tripKey(trip))
		if err != nil {
			return err
		}
		var parts []string
		for _, s := range steps {
			parts = append(parts, fmt.Sprintf("%s %s", s.Name, s.State))
		}
		say("%s's journal (DB.Steps): %s", trip, strings.Join(parts, ", "))
	}
	effects := readProvider(o.dir)
	say("provider effects: %d (one per step key: %v)", len(effects), uniqueKeys(effects) == len(effects))
	return nil
}

// child runs the booking service for trip, and SIGKILLs it where it asks.
func child(ctx context.Context, w io.Writer, dir, trip, die string) error {
	cmd := exec.CommandContext(ctx, os.Args[0])
	cmd.Env = append(os.Environ(), envChild+"="+dir, envTrip+"="+trip, envDie+"="+die)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		if lines.Text() == killMe {
			_ = cmd.Process.Signal(syscall.SIGKILL)
			_ = cmd.Wait()
			return nil
		}
		fmt.Fprintln(w, lines.Text())
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("the booking service of %s: %w", trip, err)
	}
	if die != "" {
		return fmt.Errorf("the booking service of %s ended before it was killed", trip)
	}
	return nil
}

// leaseTTL is short so that a retry after a SIGKILL takes the dead
// holder's claim over soon.
const leaseTTL = 500 * time.Millisecond

func openStore(dir string) (*receipts.DB, error) {
	return receipts.Open(filepath.Join(dir, "store"), &receipts.Options{
		LeaseTTL: leaseTTL,
		Logger:   slog.New(slog.DiscardHandler),
	})
}

func tripKey(trip string) receipts.Key { return receipts.Key{Scope: "alice", ID: trip} }

// serve is the booking service, in the child: it books trip once, under
// its key, in three steps, and dies where die says.
func serve(dir, trip, die string, w io.Writer) error {
	db, err := openStore(dir)
	if err != nil {
		return err
	}
	defer db.Close()
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	ran := false
	// Do waits for a claim whose holder died until its lease runs out, then
	// takes it over (Recovered).
	r, err := db.Do(context.Background(), tripKey(trip), []byte("LH 401, 2026-12-24, EUR 1299"), func(ctx context.Context, l *receipts.Lease) ([]byte, error) {
		ran = true
		say("attempt %d of %s (recovered: %v)", l.Attempt(), trip, l.Recovered())
		var results []string
		for _, step := range []string{"reserve", "charge", "notify"} {
			if die == "before:"+step {
				say(killMe)
				select {} // the parent kills this process here
			}
			called := false
			res, err := l.Step(ctx, step, nil, func(ctx context.Context, s *receipts.Step) ([]byte, error) {
				called = true
				say("  %s: runs (recovered: %v), provider key %s", step, s.Recovered(), s.ProviderKey())
				conf, dup, err := callProvider(dir, s.ProviderKey(), step)
				if err != nil {
					return nil, err
				}
				if dup {
					say("  provider: %s already done under this key: %s (deduplicated, not done again)", step, conf)
				} else {
					say("  provider: %s done: %s", step, conf)
				}
				if die == "in:"+step {
					say(killMe)
					select {} // the parent kills this process here: the step's outcome is never recorded
				}
				return []byte(conf), nil
			})
			if err != nil {
				return nil, err
			}
			if !called {
				say("  %s: finished in an earlier attempt, not run again: %s", step, res)
			}
			results = append(results, string(res))
		}
		return []byte(strings.Join(results, "; ")), nil
	}, receipts.WaitForResult())
	if err != nil {
		return err
	}
	if !ran {
		say("%s: answered from its receipt, no step ran", trip)
	}
	say("%s booked: %s", trip, r.Result)
	return nil
}

// The provider: its log (one line per effect: key, step, confirmation) is
// its memory of what it did, by the idempotency key it was given, as
// Stripe's is.

type effect struct{ key, step, conf string }

func readProvider(dir string) []effect {
	b, err := os.ReadFile(filepath.Join(dir, "provider.log"))
	if err != nil {
		return nil
	}
	var out []effect
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if f := strings.SplitN(l, "\t", 3); len(f) == 3 {
			out = append(out, effect{f[0], f[1], f[2]})
		}
	}
	return out
}

func uniqueKeys(effects []effect) int {
	seen := map[string]bool{}
	for _, e := range effects {
		seen[e.key] = true
	}
	return len(seen)
}

// callProvider does step's effect under key once: a key it has seen gets
// the first call's confirmation back (dup).
func callProvider(dir, key, step string) (conf string, dup bool, err error) {
	effects := readProvider(dir)
	for _, e := range effects {
		if e.key == key {
			return e.conf, true, nil
		}
	}
	switch step {
	case "reserve":
		conf = fmt.Sprintf("seat 12A held (H-%d)", len(effects)+1)
	case "charge":
		conf = fmt.Sprintf("EUR 1299.00 charged (CH-%d)", len(effects)+1)
	case "notify":
		conf = fmt.Sprintf("itinerary e-mailed (M-%d)", len(effects)+1)
	default:
		return "", false, errors.New("unknown step " + step)
	}
	f, err := os.OpenFile(filepath.Join(dir, "provider.log"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return "", false, err
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "%s\t%s\t%s\n", key, step, conf); err != nil {
		return "", false, err
	}
	return conf, false, f.Sync()
}
