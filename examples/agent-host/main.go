// Command agent-host shows the host half of exactly-once tool calls: an
// agent host whose scripted model proposes tool calls, a person who
// approves them, and a journal (package intents) that keeps each approved
// call with its operation key until the tool service (receiptmcp on a
// receipts store) has answered it, across crashes of the host.
//
//	go run ./examples/agent-host            # you are alice: answer y or n
//	go run ./examples/agent-host -answers y,n,y
//
// The host runs as a child process, and is SIGKILLed twice: before the
// service saw its first call, and after the service did its last call's
// effect but before the answer reached the host. Each time it is started
// again and resumes with the same keys. The summary counts approvals,
// effects at the service and duplicate effects (0). Nothing leaves
// 127.0.0.1; the directory is a temporary one unless -dir names one.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
)

// Environment of the host child.
const (
	envChild   = "AGENT_HOST_CHILD" // the directory; set only in the child
	envService = "AGENT_HOST_SERVICE"
	envCrash   = "AGENT_HOST_CRASH_BEFORE"
)

type options struct {
	dir     string
	answers string // the person's answers, comma-separated; "" asks on stdin
	stdin   io.Reader
}

func main() {
	if dir := os.Getenv(envChild); dir != "" {
		err := runHost(context.Background(), os.Stdout, os.Stdin, hostOptions{dir: dir, service: os.Getenv(envService), crashBefore: os.Getenv(envCrash)})
		if err != nil {
			fmt.Fprintln(os.Stderr, "host:", err)
			os.Exit(1)
		}
		return
	}
	var o options
	flag.StringVar(&o.dir, "dir", "", "directory for the service's store, the host's journal and run state (default: a temporary one, removed at exit)")
	flag.StringVar(&o.answers, "answers", "", "alice's answers, e.g. y,n,y (default: ask on the terminal)")
	flag.Parse()
	o.stdin = os.Stdin
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Stdout, o); err != nil {
		fmt.Fprintln(os.Stderr, "agent-host:", err)
		os.Exit(1)
	}
}

// run plays the story: three lives of the host against one service.
func run(ctx context.Context, w io.Writer, o options) error {
	if o.dir == "" {
		tmp, err := os.MkdirTemp("", "agent-host")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		o.dir = tmp
	}
	svc, err := startTravel(o.dir)
	if err != nil {
		return err
	}
	defer svc.close()
	p := &person{w: w}
	if o.answers != "" {
		p.script = strings.Split(o.answers, ",")
	} else {
		p.in = bufio.NewScanner(o.stdin)
	}
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	say("tool service (receiptmcp on a receipts store) at %s", svc.url)

	say("\n== host, life 1 ==")
	h, err := startHost(o.dir, svc.url, "book_flight")
	if err != nil {
		return err
	}
	if err := h.until(ctx, w, p, "host: calling book_flight"); err != nil {
		return err
	}
	h.kill()
	say("== SIGKILL: the host dies before the service saw the call (effects at the service: %d) ==", len(svc.snapshot()))

	say("\n== host, life 2 ==")
	svc.mu.Lock()
	svc.holdAfter = "send_email"
	svc.mu.Unlock()
	if h, err = startHost(o.dir, svc.url, ""); err != nil {
		return err
	}
	if err := h.until(ctx, w, p, "host: calling send_email"); err != nil {
		return err
	}
	select { // the service did the effect, and holds its answer
	case <-svc.effected:
	case <-ctx.Done():
		return ctx.Err()
	}
	h.kill()
	close(svc.release)
	say("== SIGKILL: the service sent the email, the host dies before the answer reached it (effects at the service: %d) ==", len(svc.snapshot()))

	say("\n== host, life 3 ==")
	if h, err = startHost(o.dir, svc.url, ""); err != nil {
		return err
	}
	if err := h.until(ctx, w, p, ""); err != nil {
		return err
	}
	if err := h.wait(); err != nil {
		return err
	}

	effects := svc.snapshot()
	perKey := map[string]int{}
	say("\neffects at the service (its own log):")
	for _, e := range effects {
		perKey[e.key]++
		say("  %s, key %s", e.what, e.key)
	}
	dups := 0
	for _, n := range perKey {
		dups += n - 1
	}
	say("approvals: %d (declined: %d)", p.yes, p.no)
	say("effects at the service: %d", len(effects))
	say("duplicate effects: %d", dups)
	say("host restarts: 2")
	if dups != 0 || len(effects) != p.yes {
		return fmt.Errorf("%d effects for %d approvals, %d duplicates", len(effects), p.yes, dups)
	}
	return nil
}

// person answers the host's questions: from a script, or from a terminal.
type person struct {
	w       io.Writer
	script  []string
	in      *bufio.Scanner
	yes, no int
}

func (p *person) answer(question string) (string, error) {
	fmt.Fprintf(p.w, "%s ", question)
	var a string
	if p.in != nil {
		if !p.in.Scan() {
			return "", errors.New("no answer")
		}
		a = strings.TrimSpace(p.in.Text())
	} else {
		if len(p.script) == 0 {
			return "", errors.New("-answers ran out")
		}
		a, p.script = strings.TrimSpace(p.script[0]), p.script[1:]
		fmt.Fprintln(p.w, a)
	}
	if a == "y" {
		p.yes++
	} else {
		p.no++
	}
	return a, nil
}

// host is a running host process.
type host struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines *bufio.Scanner
}

func startHost(dir, service, crashBefore string) (*host, error) {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), envChild+"="+dir, envService+"="+service, envCrash+"="+crashBefore)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return &host{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout)}, nil
}

// until prints the host's lines, answering its questions, up to and
// including the first line that starts with stop ("": until it exits).
func (h *host) until(ctx context.Context, w io.Writer, p *person, stop string) error {
	for h.lines.Scan() {
		if err := ctx.Err(); err != nil {
			h.kill()
			return err
		}
		l := h.lines.Text()
		if q, ok := strings.CutPrefix(l, "ASK "); ok {
			a, err := p.answer(q)
			if err != nil {
				h.kill()
				return err
			}
			if _, err := fmt.Fprintln(h.stdin, a); err != nil {
				return err
			}
			continue
		}
		fmt.Fprintln(w, l)
		if stop != "" && strings.HasPrefix(l, stop) {
			return nil
		}
	}
	if stop != "" {
		return fmt.Errorf("the host ended before %q: %v", stop, h.wait())
	}
	return nil
}

func (h *host) kill() {
	_ = h.cmd.Process.Signal(syscall.SIGKILL)
	_ = h.cmd.Wait()
}

func (h *host) wait() error {
	_ = h.stdin.Close()
	return h.cmd.Wait()
}
