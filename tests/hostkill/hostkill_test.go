package hostkill_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/internal/testkit"
	"go.uber.org/goleak"
)

// TestHostKill runs the harness (see the package doc) for each transport
// on Pebble: the service's store and the host's journal in directories.
func TestHostKill(t *testing.T) {
	for _, wire := range []string{"http", "mcp"} {
		t.Run(wire, func(t *testing.T) { runVariant(t, wire, "pebble") })
	}
}

// TestHostKillPostgres is TestHostKill on PostgreSQL: the service on
// pgstore, the host's journal on intentspg, in two schemas of one
// database.
func TestHostKillPostgres(t *testing.T) {
	for _, wire := range []string{"http", "mcp"} {
		t.Run(wire, func(t *testing.T) { runVariant(t, wire, "pg") })
	}
}

// child is a running child process.
type child struct {
	cmd    *exec.Cmd
	lines  chan string // stdout, line by line; closed at EOF
	stderr *strings.Builder
	done   chan error // Wait's result
}

func start(t *testing.T, c config) *child {
	t.Helper()
	b, _ := json.Marshal(c)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envConfig+"="+string(b))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	ch := &child{cmd: cmd, lines: make(chan string, 16), stderr: &strings.Builder{}, done: make(chan error, 1)}
	cmd.Stderr = &lockedWriter{w: ch.stderr}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			ch.lines <- sc.Text()
		}
		close(ch.lines)
		ch.done <- cmd.Wait()
	}()
	return ch
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// await returns the first line with prefix, or fails t after d.
func (c *child) await(t *testing.T, prefix string, d time.Duration) string {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case l, ok := <-c.lines:
			if !ok {
				err := <-c.done
				c.done <- err
				t.Fatalf("child exited (%v) before %q; stderr:\n%s", err, prefix, c.stderr)
			}
			if strings.HasPrefix(l, prefix) {
				return l
			}
		case <-timer.C:
			c.kill()
			t.Fatalf("no %q within %s; stderr:\n%s", prefix, d, c.stderr)
		}
	}
}

// kill SIGKILLs the child and waits for it; it reports whether the kill
// ended it (false: it had exited already).
func (c *child) kill() bool {
	err := c.cmd.Process.Signal(syscall.SIGKILL)
	for range c.lines {
	}
	werr := <-c.done
	c.done <- werr
	var ee *exec.ExitError
	return err == nil && errors.As(werr, &ee) && ee.Sys().(syscall.WaitStatus).Signaled()
}

// exit waits for the child to end by itself and returns its error.
func (c *child) exit(t *testing.T, d time.Duration) error {
	t.Helper()
	drained := make(chan struct{})
	go func() {
		for range c.lines {
		}
		close(drained)
	}()
	select {
	case <-drained:
	case <-time.After(d):
		c.kill()
		t.Fatalf("child did not finish within %s; stderr:\n%s", d, c.stderr)
	}
	err := <-c.done
	c.done <- err
	return err
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// stats are a variant's counts.
type stats struct {
	cycles, hostKilled, hostExited        int
	svcRestarts, svcKilledMidRun, resumed int
	pgRestarts                            int
}

func runVariant(t *testing.T, wire, engine string) {
	leaks := goleak.IgnoreCurrent()
	defer goleak.VerifyNone(t, leaks)
	cycles := testkit.EnvInt("RECEIPTS_HOST_KILLS", hostKillCycles)
	if testkit.Soak() {
		cycles = testkit.EnvInt("RECEIPTS_HOST_KILLS", 500)
	}
	seed := testkit.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0x40571))
	// One host restarted again and again, under one HostName, as a host
	// with a stable name (its machine's) is: each run takes back at once
	// the leases the SIGKILLed one held. (Takeover by another host is
	// TestHostKillSharedJournal's.)
	c := config{Dir: t.TempDir(), Wire: wire, Engine: engine, Port: freePort(t), Seed: seed, HostName: "harness-host"}
	if engine == "pg" {
		c.DSN, c.SvcSchema = pgtest.Schema(t)
		_, c.HostSchema = pgtest.Schema(t)
	}
	begin := time.Now()
	var st stats
	svcConf := c
	svcConf.Role = "service"
	svc := start(t, svcConf)
	svc.await(t, "READY", time.Minute)
	restartService := func() {
		svc.kill()
		svcConf.OffsetHours++
		svcConf.Seed = rng.Uint64()
		svc = start(t, svcConf)
		svc.await(t, "READY", time.Minute)
		st.svcRestarts++
	}
	defer func() { svc.kill() }()

	for gen := range cycles {
		if gen > 0 && rng.IntN(5) == 0 {
			restartService() // between two host runs
		}
		hc := c
		hc.Role, hc.Gen, hc.Seed, hc.Approvals = "host", gen, rng.Uint64(), 2+rng.IntN(3)
		host := start(t, hc)
		var resumed int
		if _, err := fmt.Sscanf(host.await(t, "READY", time.Minute), "READY resumed=%d", &resumed); err != nil {
			t.Fatal(err)
		}
		st.resumed += resumed
		switch mode := rng.IntN(10); {
		case engine == "pg" && gen%10 == 5: // crash PostgreSQL under both, then let the host finish
			time.Sleep(time.Duration(rng.IntN(40_000)) * time.Microsecond)
			if err := pgtest.Restart(t); err != nil && !errors.Is(err, pgtest.ErrExternal) {
				t.Fatal(err)
			}
			st.pgRestarts++
			if err := host.exit(t, 2*time.Minute); err != nil {
				t.Fatalf("gen %d: host failed after a PostgreSQL crash: %v\n%s", gen, err, host.stderr)
			}
			st.hostExited++
		case mode < 7: // SIGKILL the host at a random moment
			time.Sleep(time.Duration(rng.IntN(80_000)) * time.Microsecond)
			if host.kill() {
				st.hostKilled++
			} else if err := host.exit(t, time.Second); err != nil {
				t.Fatalf("gen %d: host failed: %v\n%s", gen, err, host.stderr)
			} else {
				st.hostExited++
			}
		case mode < 8: // SIGKILL the service in the middle of the host's run, then the host
			time.Sleep(time.Duration(rng.IntN(40_000)) * time.Microsecond)
			restartService()
			st.svcKilledMidRun++
			time.Sleep(time.Duration(rng.IntN(40_000)) * time.Microsecond)
			if host.kill() {
				st.hostKilled++
			} else {
				st.hostExited++
			}
		default: // let the host finish
			if err := host.exit(t, time.Minute); err != nil {
				t.Fatalf("gen %d: host failed: %v\n%s", gen, err, host.stderr)
			}
			st.hostExited++
		}
		st.cycles++
	}
	// The last host delivers everything left.
	last := c
	last.Role, last.Gen, last.Final = "host", cycles, true
	host := start(t, last)
	host.await(t, "READY", time.Minute)
	host.await(t, "DONE", 2*time.Minute)
	if err := host.exit(t, time.Minute); err != nil {
		t.Fatalf("last host: %v\n%s", err, host.stderr)
	}
	svc.kill()

	r, err := analyze(context.Background(), c)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s on %s: %d host runs in %s (%d SIGKILLed, %d finished), service restarts %d (%d while the host was in calls), PostgreSQL crashes %d, actions resumed after a restart %d",
		wire, engine, st.cycles, time.Since(begin).Round(time.Millisecond), st.hostKilled, st.hostExited, st.svcRestarts, st.svcKilledMidRun, st.pgRestarts, st.resumed)
	t.Logf("%s on %s: %s", wire, engine, r)
	if r.bad() {
		t.Fatalf("violations (seed %d):\n%s", seed, strings.Join(r.problems, "\n"))
	}
	if r.actions == 0 || r.succeeded == 0 || st.hostKilled < st.cycles/3 {
		t.Fatalf("run too thin: %+v %+v", r, st)
	}
}
