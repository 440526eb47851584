package pgnodes

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Kinds of Event.
const (
	KindGrant   = 'G' // a worker was handed a lease (fn started, or Claim returned one)
	KindFnEnd   = 'F' // the worker decided its attempt's outcome (What: commit, fail, release, abandon)
	KindAck     = 'A' // a worker was told about a receipt (What: do, claim, commit, lookup); fsynced
	KindErr     = 'X' // an operation ended with an error (What: inprogress, notfound, leaselost, notperformed, abandoned, error)
	KindEffect  = 'E' // the provider performed an effect (provider log; fsynced)
	KindFinal   = 'V' // a verifying node's Lookup of a key at the end (State "-" if not found)
	KindReplay  = 'D' // a verifying node's Do on a finished key at the end (must replay)
	KindProblem = 'Z' // a verifying node saw something wrong (What says what)
)

// Event is one line of a log. Every kind has the same fields; unused ones are "-" or 0.
type Event struct {
	Kind      byte
	Inc       string // the process incarnation that wrote it ("n1g3", "v0", "settle")
	Op        string // operation id, unique in the run
	Key       string
	What      string
	State     string // "S" succeeded, "F" failed, "P" pending, "-" none
	Result    string
	Token     uint64
	Attempt   uint32
	Recovered bool
	PK        string // effects: the ProviderKey the effect was made under
	Call, Ret int64  // unix nanoseconds: when the operation (or step) started and ended
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func undash(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

// line renders ev; the trailing " ." marks a complete line (a SIGKILL can leave a torn last line).
func (ev Event) line() []byte {
	rec := 0
	if ev.Recovered {
		rec = 1
	}
	return fmt.Appendf(nil, "%c %s %s %s %s %s %s %d %d %d %s %d %d .\n", ev.Kind, dash(ev.Inc), dash(ev.Op), dash(ev.Key),
		dash(ev.What), dash(ev.State), dash(ev.Result), ev.Token, ev.Attempt, rec, dash(ev.PK), ev.Call, ev.Ret)
}

var errMalformed = errors.New("pgnodes: malformed log line")

func parseLine(s string) (Event, error) {
	f := strings.Fields(s)
	if len(f) != 14 || f[13] != "." || len(f[0]) != 1 {
		return Event{}, fmt.Errorf("%w: %q", errMalformed, s)
	}
	var ev Event
	var err error
	var n [5]uint64
	for i, j := range []int{7, 8, 9, 11, 12} {
		if n[i], err = strconv.ParseUint(f[j], 10, 64); err != nil {
			return Event{}, fmt.Errorf("%w: %q: %w", errMalformed, s, err)
		}
	}
	ev.Kind, ev.Inc, ev.Op, ev.Key, ev.What = f[0][0], undash(f[1]), undash(f[2]), undash(f[3]), undash(f[4])
	ev.State, ev.Result, ev.PK = undash(f[5]), undash(f[6]), undash(f[10])
	ev.Token, ev.Attempt, ev.Recovered, ev.Call, ev.Ret = n[0], uint32(n[1]), n[2] == 1, int64(n[3]), int64(n[4])
	return ev, nil
}

// Log is an append-only log file shared by goroutines (and, for the provider log, by
// processes): every Event is one write(2) on an O_APPEND descriptor, fsynced when asked.
type Log struct {
	f *os.File
}

// OpenLog opens (creating) path for appending.
func OpenLog(path string) (*Log, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	return &Log{f: f}, nil
}

// Append writes ev, and fsyncs it if sync is set.
func (l *Log) Append(ev Event, sync bool) error {
	if _, err := l.f.Write(ev.line()); err != nil {
		return fmt.Errorf("pgnodes: append: %w", err)
	}
	if sync {
		if err := l.f.Sync(); err != nil {
			return fmt.Errorf("pgnodes: fsync: %w", err)
		}
	}
	return nil
}

// Close closes the file.
func (l *Log) Close() error { return l.f.Close() }

// ReadLog returns the events of one log file. A last line without its end mark (a writer was
// killed mid-line) is ignored; any other malformed line is an error.
func ReadLog(path string) ([]Event, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []Event
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		s := sc.Text()
		if !strings.HasSuffix(s, " .") {
			if !sc.Scan() { // torn last line
				break
			}
			return nil, fmt.Errorf("%s: %w: %q", path, errMalformed, s)
		}
		ev, err := parseLine(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		out = append(out, ev)
	}
	return out, sc.Err()
}

// File names in a run's directory.
const (
	providerLog = "provider.log"
	histPrefix  = "hist-"  // hist-<inc>.log: a node incarnation's grants, outcomes and acks
	finalPrefix = "final-" // final-<inc>.log: a verifying node's view at the end
)

// Provider is the external provider of the harness: every effect is a line of the shared,
// fsynced provider log, and Find answers "did an effect with this idempotency key happen?" the
// way a real provider's lookup by idempotency key would.
type Provider struct {
	path string
	log  *Log

	mu    sync.Mutex       // serializes this process's appends and reads (other processes' appends are atomic lines)
	off   int64            // bytes of the log already indexed; guarded by mu
	first map[string]Event // idempotency key -> its first effect, of the indexed part; guarded by mu
}

// OpenProvider opens the provider log of the run directory dir.
func OpenProvider(dir string) (*Provider, error) {
	path := filepath.Join(dir, providerLog)
	l, err := OpenLog(path)
	if err != nil {
		return nil, err
	}
	return &Provider{path: path, log: l, first: map[string]Event{}}, nil
}

// Perform records an effect (fsynced before it returns).
func (p *Provider) Perform(ev Event) error {
	ev.Kind = KindEffect
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.Append(ev, true)
}

// Find returns the first effect made under the idempotency key pk, if any, by any process.
// It reads only what was appended since its last call.
func (p *Provider) Find(pk string) (Event, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, err := os.Open(p.path)
	if err != nil {
		return Event{}, false, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.NewSectionReader(f, p.off, math.MaxInt64-p.off))
	if err != nil {
		return Event{}, false, err
	}
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break // a line still being written by another process: read it next time
		}
		ev, err := parseLine(string(b[:i]))
		if err != nil {
			return Event{}, false, fmt.Errorf("%s: %w", p.path, err)
		}
		if _, ok := p.first[ev.PK]; !ok && ev.Kind == KindEffect {
			p.first[ev.PK] = ev
		}
		p.off += int64(i + 1)
		b = b[i+1:]
	}
	ev, ok := p.first[pk]
	return ev, ok, nil
}

// Close closes the provider log.
func (p *Provider) Close() error { return p.log.Close() }

// ReadRun reads every log of the run directory dir.
func ReadRun(dir string) ([]Event, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.log"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var all []Event
	for _, n := range names {
		b := filepath.Base(n)
		if b != providerLog && !strings.HasPrefix(b, histPrefix) && !strings.HasPrefix(b, finalPrefix) {
			continue
		}
		evs, err := ReadLog(n)
		if err != nil {
			return nil, err
		}
		all = append(all, evs...)
	}
	return all, nil
}
