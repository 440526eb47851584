package pgnodes

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/pebblestore"
	"github.com/receiptstore/receipts/pgstore"
)

// The cross-node harness (see doc.go). The parent test starts node processes (this test binary
// re-executed, running only TestNodeChild, told what to do by environment variables), SIGKILLs
// and restarts them, restarts the database, cuts connections, then has every node verify the
// store and checks the logs.
//
//	go test -run TestCrossNode ./tests/pgnodes                   # CI sizes
//	RECEIPTS_SOAK=1 go test -run TestCrossNode ./tests/pgnodes   # soak sizes
//	RECEIPTS_PGNODES_SECONDS=120 RECEIPTS_PGNODES_KILLS=100 ...     # any size
//	RECEIPTS_SEED=n ...                                             # reuse a seed (choices, not timing)

// harnessTTL is the LeaseTTL of every node: short, so that the leases of killed nodes run out
// (and are taken over) within the run.
const harnessTTL = 500 * time.Millisecond

// pebbleOpen opens the Pebble engine on the directory dsn. Only one process may hold it.
func pebbleOpen(_ context.Context, dsn string) (*receipts.DB, io.Closer, error) {
	db, err := pebblestore.Open(dsn, &pebblestore.Options{
		Options: receipts.Options{
			LeaseTTL:   harnessTTL,
			GCInterval: -1,
		},
		Pebble: &pebble.Options{FS: vfs.Default, Logger: quietLogger{}},
	})
	return db, nil, err
}

// pgOpen opens one node on the PostgreSQL database dsn (the proxy's address: the pool and the
// LISTEN connection both go through it, so a cut breaks both).
var pgOpen OpenFunc = func(ctx context.Context, dsn string) (*receipts.DB, io.Closer, error) {
	pool, err := newPool(ctx, dsn)
	if err != nil {
		return nil, nil, err
	}
	db, err := pgstore.Open(ctx, pool, &pgstore.Options{
		Options:    receipts.Options{LeaseTTL: harnessTTL},
		ListenConn: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, dsn) },
	})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return db, poolCloser{pool}, nil
}

type quietLogger struct{}

func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
	os.Exit(3)
}

// Environment of a node process.
const (
	envRole     = "RECEIPTS_PGNODES_ROLE" // "node" or "verify"; set only in node processes
	envEngine   = "RECEIPTS_PGNODES_ENGINE"
	envDSN      = "RECEIPTS_PGNODES_DSN"
	envDir      = "RECEIPTS_PGNODES_DIR"
	envInc      = "RECEIPTS_PGNODES_INC"
	envSeed     = "RECEIPTS_PGNODES_SEED"
	envStart    = "RECEIPTS_PGNODES_START"
	envDeadline = "RECEIPTS_PGNODES_DEADLINE"
	envSettle   = "RECEIPTS_PGNODES_SETTLE"
	stopFile    = "stop"
	readyLine   = "PGNODES READY"
)

// envSlide, if set, is the window's Slide in node processes (set in the parent's environment,
// which they inherit, or by plan.slide): the failover harness moves it faster, so that more is
// written.
const envSlide = "RECEIPTS_PGNODES_SLIDE"

func workload(start time.Time) Workload {
	slide := 200 * time.Millisecond
	if d, err := time.ParseDuration(os.Getenv(envSlide)); err == nil && d > 0 {
		slide = d
	}
	return Workload{Workers: 8, Keys: 6, Slide: slide, Start: start, TTL: harnessTTL, OpTimeout: 20 * time.Second}
}

// TestNodeChild is a node process; it does nothing in a normal test run.
func TestNodeChild(t *testing.T) {
	role := os.Getenv(envRole)
	if role == "" {
		t.Skip("runs only as a node process of TestCrossNode*")
	}
	open := pebbleOpen
	if os.Getenv(envEngine) == "pg" {
		open = pgOpen
	}
	dir, dsn, inc := os.Getenv(envDir), os.Getenv(envDSN), os.Getenv(envInc)
	startNS, _ := strconv.ParseInt(os.Getenv(envStart), 10, 64)
	deadlineNS, _ := strconv.ParseInt(os.Getenv(envDeadline), 10, 64)
	seed, _ := strconv.ParseUint(os.Getenv(envSeed), 10, 64)
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, deadlineNS))
	defer cancel()

	// The database may be restarting, or the proxy cutting: retry the open.
	var db *receipts.DB
	var closer io.Closer
	for {
		var err error
		db, closer, err = open(ctx, dsn)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("open: %v", err)
		}
		fmt.Fprintf(os.Stderr, "open: %v (retrying)\n", err)
		time.Sleep(200 * time.Millisecond)
	}
	defer func() {
		if err := db.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
		if closer != nil {
			_ = closer.Close()
		}
	}()
	fmt.Println(readyLine)

	switch role {
	case "node":
		// Stop when the parent says so (the stop file) or at the deadline.
		go func() {
			for ctx.Err() == nil {
				if _, err := os.Stat(filepath.Join(dir, stopFile)); err == nil {
					cancel()
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
		n := &Node{DB: db, Inc: inc, Dir: dir, Seed: seed, Workload: workload(time.Unix(0, startNS))}
		if err := n.Run(ctx); err != nil {
			t.Fatal(err)
		}
		if err := writeMetrics(filepath.Join(dir, metricsPrefix+inc+".txt"), db); err != nil {
			t.Fatal(err)
		}
	case "verify":
		evs, err := ReadRun(dir)
		if err != nil {
			t.Fatal(err)
		}
		keys := Keys(evs)
		if os.Getenv(envSettle) == "1" {
			if err := Settle(ctx, db, dir, keys); err != nil {
				t.Fatal(err)
			}
		}
		if err := Verify(ctx, db, dir, inc, keys); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("unknown role %q", role)
	}
}

// sizes of a run.
type plan struct {
	engine   string // "pebble" or "pg"
	dsn      string // what nodes open
	nodes    int
	duration time.Duration
	kills    int           // SIGKILLs of nodes, at least
	restarts int           // database restarts, at least (needs restart)
	restart  func() error  // restarts the database (or fails it over); nil: none
	proxy    *Proxy        // cut at random moments; nil: none
	cutEvery time.Duration // mean time between cuts
	// lossy: the run may lose what the store acknowledged (asynchronous replication): its
	// violations are logged as figures, not failed.
	lossy bool
	// after, if set, checks more once the run is checked (the failover harness's own checks).
	after func(dir string, evs []Event, rep *Report)
	// slide, if not zero, is the window's Slide in the node processes (envSlide), passed to
	// them rather than set in the parent's environment, so that harnesses run in parallel.
	slide time.Duration
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func soak() bool { return os.Getenv("RECEIPTS_SOAK") == "1" }

func seedOf(t *testing.T) uint64 {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("RECEIPTS_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("RECEIPTS_SEED: %v", err)
		}
		seed = v
	}
	t.Logf("seed %d (RECEIPTS_SEED=%d reuses its random choices; timing differs)", seed, seed)
	return seed
}

// child is one node process.
type child struct {
	inc   string
	cmd   *exec.Cmd
	ready chan struct{} // closed when the node has opened the store
	exit  chan struct{} // closed when the process has exited
	err   error         // its exit status, once exit is closed

	spawned time.Time
}

type runner struct {
	t     *testing.T
	p     plan
	dir   string
	start time.Time
	seed  uint64
	rng   *rand.Rand
	end   time.Time // nodes stop by themselves at end (the parent's own bound)
}

func (r *runner) spawn(role, inc string, env ...string) *child {
	r.t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestNodeChild$", "-test.count=1", "-test.timeout=0")
	cmd.Env = append(os.Environ(),
		envRole+"="+role, envEngine+"="+r.p.engine, envDSN+"="+r.p.dsn, envDir+"="+r.dir, envInc+"="+inc,
		envSeed+"="+strconv.FormatUint(r.rng.Uint64(), 10), envStart+"="+strconv.FormatInt(r.start.UnixNano(), 10),
		envDeadline+"="+strconv.FormatInt(r.end.UnixNano(), 10))
	if r.p.slide > 0 {
		cmd.Env = append(cmd.Env, envSlide+"="+r.p.slide.String())
	}
	cmd.Env = append(cmd.Env, env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := os.Create(filepath.Join(r.dir, "stderr-"+inc+".txt"))
	if err != nil {
		r.t.Fatal(err)
	}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	c := &child{inc: inc, cmd: cmd, ready: make(chan struct{}), exit: make(chan struct{}), spawned: time.Now()}
	go func() {
		sc := bufio.NewScanner(out)
		ready := false
		var tail []string
		for sc.Scan() {
			if sc.Text() == readyLine && !ready {
				ready = true
				close(c.ready)
			}
			tail = append(tail, sc.Text())
			if len(tail) > 40 {
				tail = tail[1:]
			}
		}
		c.err = cmd.Wait()
		_ = stderr.Close()
		if c.err != nil && !killed(c.err) {
			c.err = fmt.Errorf("%s: %w\nstdout:\n%s\nstderr: %s", inc, c.err, strings.Join(tail, "\n"), filepath.Join(r.dir, "stderr-"+inc+".txt"))
		}
		close(c.exit)
	}()
	return c
}

func killed(err error) bool {
	var ee *exec.ExitError
	return errors.As(err, &ee) && ee.ProcessState.Sys().(syscall.WaitStatus).Signaled()
}

// kill SIGKILLs c and waits for it.
func (r *runner) kill(c *child) {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.exit
}

func (r *runner) isReady(c *child) bool {
	select {
	case <-c.ready:
		return true
	default:
		return false
	}
}

// failIfDied fails the test if c exited on its own with an error.
func (r *runner) failIfDied(c *child) {
	select {
	case <-c.exit:
		if c.err != nil && !killed(c.err) {
			r.t.Fatalf("node died: %v", c.err)
		}
	default:
	}
}

// crossNode runs a whole harness and checks it.
func crossNode(t *testing.T, p plan) *Report {
	seed := seedOf(t)
	r := &runner{t: t, p: p, dir: t.TempDir(), seed: seed, rng: rand.New(rand.NewPCG(seed, 14))}
	r.start = time.Now()
	r.end = r.start.Add(p.duration*3 + 2*time.Minute) // nodes stop by themselves at the latest then
	t.Logf("%s: %d nodes x 8 workers for %v; at least %d SIGKILLs, %d database restarts; logs in %s",
		p.engine, p.nodes, p.duration, p.kills, p.restarts, r.dir)

	nodes := make([]*child, p.nodes)
	gens := make([]int, p.nodes)
	for i := range nodes {
		nodes[i] = r.spawn("node", fmt.Sprintf("n%dg0", i))
	}
	killEvery := p.duration / time.Duration(p.kills+1)
	nextKill := time.Now().Add(killEvery)
	var restartTimes []time.Time
	for j := range p.restarts {
		restartTimes = append(restartTimes, r.start.Add(p.duration*time.Duration(j+1)/time.Duration(p.restarts+1)))
	}
	nextCut := time.Now().Add(time.Duration(r.rng.Int64N(int64(2*p.cutEvery + 1))))
	kills, cuts, cutConns := 0, 0, 0
	restarts := 0
	restartErr := make(chan error, 1)
	restarting := false
	hardEnd := r.start.Add(2*p.duration + time.Minute)
	for {
		now := time.Now()
		if now.After(hardEnd) {
			t.Fatalf("the schedule did not complete in time: %d kills, %d restarts", kills, restarts)
		}
		doneKills := kills >= p.kills
		doneRestarts := p.restart == nil || (restarts >= p.restarts && !restarting)
		if now.Sub(r.start) >= p.duration && doneKills && doneRestarts {
			break
		}
		for _, c := range nodes {
			r.failIfDied(c)
			if !r.isReady(c) && now.Sub(c.spawned) > 90*time.Second {
				t.Fatalf("%s did not open the store in 90s (stderr: %s)", c.inc, filepath.Join(r.dir, "stderr-"+c.inc+".txt"))
			}
		}
		if p.kills > 0 && !now.Before(nextKill) {
			// SIGKILL a random node that is running its workload, and start it again.
			var ready []int
			for i, c := range nodes {
				if r.isReady(c) {
					ready = append(ready, i)
				}
			}
			if len(ready) > 0 {
				i := ready[r.rng.IntN(len(ready))]
				r.kill(nodes[i])
				kills++
				gens[i]++
				nodes[i] = r.spawn("node", fmt.Sprintf("n%dg%d", i, gens[i]))
				nextKill = now.Add(killEvery/2 + time.Duration(r.rng.Int64N(int64(killEvery))))
			}
		}
		if p.restart != nil && !restarting && restarts < p.restarts && len(restartTimes) > 0 && !now.Before(restartTimes[0]) {
			restartTimes = restartTimes[1:]
			restarting = true
			go func() { restartErr <- p.restart() }()
		}
		select {
		case err := <-restartErr:
			if err != nil {
				t.Fatalf("database restart: %v", err)
			}
			restarting = false
			restarts++
		default:
		}
		if p.proxy != nil && !now.Before(nextCut) {
			cuts++
			cutConns += p.proxy.Cut()
			nextCut = now.Add(time.Duration(r.rng.Int64N(int64(2*p.cutEvery + 1))))
		}
		time.Sleep(10 * time.Millisecond)
	}
	loadTime := time.Since(r.start)

	// Stop every node (each finishes its operations and closes the store).
	if err := os.WriteFile(filepath.Join(r.dir, stopFile), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range nodes {
		select {
		case <-c.exit:
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s did not stop", c.inc)
		}
		if c.err != nil {
			t.Fatalf("node failed: %v", c.err)
		}
	}

	// Every node verifies: the first settles abandoned claims first.
	verifiers := []string{"v0"}
	v0 := r.spawn("verify", "v0", envSettle+"=1")
	<-v0.exit
	if v0.err != nil {
		t.Fatalf("verify v0: %v", v0.err)
	}
	var vs []*child
	for i := 1; i < p.nodes; i++ {
		v := fmt.Sprintf("v%d", i)
		verifiers = append(verifiers, v)
		vs = append(vs, r.spawn("verify", v))
	}
	for _, c := range vs {
		<-c.exit
		if c.err != nil {
			t.Fatalf("verify %s: %v", c.inc, c.err)
		}
	}

	evs, err := ReadRun(r.dir)
	if err != nil {
		t.Fatal(err)
	}
	rep := Check(evs, verifiers)
	t.Logf("%s: load %v, %d SIGKILLs, %d database restarts, %d proxy cuts (%d connection sides), total %v",
		p.engine, loadTime.Round(time.Millisecond), kills, restarts, cuts, cutConns, time.Since(r.start).Round(time.Millisecond))
	if p.after != nil {
		p.after(r.dir, evs, rep)
	}
	t.Logf("checked: %s", rep)
	if !rep.OK() && p.lossy {
		t.Logf("seed %d: %d violations, expected of this run (logs kept in %s)", seed, len(rep.Violations), keep(t, r.dir))
	} else if !rep.OK() {
		t.Fatalf("seed %d: %d violations (logs kept in %s)", seed, len(rep.Violations), keep(t, r.dir))
	}
	if kills < p.kills || restarts < p.restarts && p.restart != nil {
		t.Fatalf("schedule short: %d kills, %d restarts", kills, restarts)
	}
	return rep
}

// keep copies a failed run's logs out of the test's temporary directory.
func keep(t *testing.T, dir string) string {
	dst, err := os.MkdirTemp("", "pgnodes-failed-")
	if err != nil {
		return dir + " (removed at the end of the test)"
	}
	if err := os.CopyFS(dst, os.DirFS(dir)); err != nil {
		t.Logf("keep logs: %v", err)
	}
	return dst
}

// TestCrossNodePebble runs the harness on the Pebble engine: one node at a time (a Pebble
// directory has one owner), SIGKILLed at least 30 times: the single-node baseline of the machinery.
func TestCrossNodePebble(t *testing.T) {
	if os.Getenv(envRole) != "" {
		t.Skip("in a node process")
	}
	t.Parallel() // a directory of its own; beside the failover harness, after the restarts of TestCrossNodePostgres
	secs, kills := 24, 30
	switch {
	case soak():
		secs, kills = 600, 600
	case raceEnabled:
		secs, kills = 10, 8
	}
	p := plan{
		engine:   "pebble",
		nodes:    1,
		duration: time.Duration(envInt("RECEIPTS_PGNODES_SECONDS", secs)) * time.Second,
		kills:    envInt("RECEIPTS_PGNODES_KILLS", kills),
	}
	dir := t.TempDir()
	p.dsn = filepath.Join(dir, "db")
	crossNode(t, p)
}

// TestCrossNodePostgres runs the harness of issue 14 on PostgreSQL: three node processes on one
// database, SIGKILLed at least 30 times, the server restarted (pg_ctl restart -m immediate) at
// least 3 times, and every node's connections running through a proxy that cuts them at random.
func TestCrossNodePostgres(t *testing.T) {
	if os.Getenv(envRole) != "" {
		t.Skip("in a node process")
	}
	secs, kills, restarts := 45, 32, 3
	switch {
	case soak():
		secs, kills, restarts = 600, 400, 20
	case raceEnabled:
		secs, kills, restarts = 20, 10, 1
	}
	dsn := pgtest.Database(t)
	proxyDSN, proxy := throughProxy(t, dsn)
	p := plan{
		engine:   "pg",
		dsn:      proxyDSN,
		nodes:    envInt("RECEIPTS_PGNODES_NODES", 3),
		duration: time.Duration(envInt("RECEIPTS_PGNODES_SECONDS", secs)) * time.Second,
		kills:    envInt("RECEIPTS_PGNODES_KILLS", kills),
		restarts: envInt("RECEIPTS_PGNODES_RESTARTS", restarts),
		restart:  func() error { return pgtest.Restart(t) },
		proxy:    proxy,
		cutEvery: 2 * time.Second,
	}
	if err := pgtest.Restart(t); errors.Is(err, pgtest.ErrExternal) {
		t.Logf("external server (%s): no database restarts", pgtest.EnvDSN)
		p.restart, p.restarts = nil, 0
	} else if err != nil {
		t.Fatal(err)
	}
	crossNode(t, p)
}

// throughProxy starts a proxy in front of the server of dsn and returns dsn pointed at it.
func throughProxy(t *testing.T, dsn string) (string, *Proxy) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil || u.Host == "" {
		t.Fatalf("want a URL DSN, got %q", dsn)
	}
	host := u.Host
	if _, _, err := net.SplitHostPort(host); err != nil {
		host = net.JoinHostPort(host, "5432")
	}
	p, err := NewProxy(host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	u.Host = p.Addr()
	return u.String(), p
}
