package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/receipthttp"
	"github.com/spf13/cobra"
)

// The host-crash scene: the agent host (package intents) approves a
// refund, its journal keeps the key with the request, and the host dies
// after the service performed it, before the answer reached the host.
const (
	demoHostDir = "host-journal" // the host's journal, in the demo's directory
	demoHostRef = "trip-1/call_refund"
)

var refund = toolCall{"refund", "", map[string]any{"amount_cents": 5000, "currency": "EUR"}}

// hostCrash plays the sixth scene on db, and returns how often the host
// was restarted.
func (d *demo) hostCrash(ctx context.Context, db *receipts.DB) (int, error) {
	d.say("\n6. A host crash: the agent host approves %s; its journal mints the key\n", strings.TrimSuffix(refund.String(), " [key ]"))
	effected := make(chan string, 1)
	release := make(chan struct{})
	var released bool
	defer func() {
		if !released {
			close(release)
		}
	}()
	mw, err := receipthttp.New(db, receipthttp.Config{Scope: func(*http.Request) (string, error) { return demoScope, nil }})
	if err != nil {
		return 0, err
	}
	var held atomic.Bool
	svc := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, _ := receipthttp.AttemptFrom(r.Context())
		conf, ok, err := "", false, error(nil)
		if a.Recovered {
			conf, ok, err = d.provider.lookup(a.ProviderKey)
		}
		if err == nil && !ok {
			conf, err = d.provider.perform(r.Context(), a.ProviderKey, refund)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		if held.CompareAndSwap(false, true) { // the first call: hold the answer until the host is dead
			effected <- conf
			<-release
		}
		w.Header().Set("Content-Type", "text/plain")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, conf)
	}))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	srv := &http.Server{Handler: svc, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	url := "http://" + ln.Addr().String()

	// Life 1: approve, send, and be killed once the service performed it.
	h, err := d.startHost(ctx, url)
	if err != nil {
		return 0, err
	}
	key, err := h.approved()
	if err != nil {
		return 0, err
	}
	d.say("   life 1  the host (pid %d) records the approval with key %s, durable before anything is sent,\n", h.cmd.Process.Pid, key)
	var conf string
	select {
	case conf = <-effected:
	case <-time.After(demoTimeout):
		h.kill()
		return 0, errors.New("the service never got the host's call")
	}
	h.kill()
	close(release)
	released = true
	d.calls.Add(1)
	d.say("           sends it (Idempotency-Key: %s); the service performs it -> %s,\n", key, conf)
	d.say("           and the host is killed (%s) before the answer reaches it\n", h.cmd.ProcessState)

	// Life 2: the restarted host approves the same call again (the agent
	// SDK resumes its run): the journal returns the same action.
	if h, err = d.startHost(ctx, url); err != nil {
		return 1, err
	}
	again, err := h.approved()
	if err != nil {
		return 1, err
	}
	if again != key {
		h.kill()
		return 1, fmt.Errorf("the restarted host approved %s under a new key %s", key, again)
	}
	line, err := h.line()
	if err != nil {
		return 1, err
	}
	if err := h.cmd.Wait(); err != nil {
		return 1, fmt.Errorf("the demo's host: %w", err)
	}
	d.calls.Add(1)
	d.say("   life 2  the restarted host approves the same tool call again (Ref %s): the journal returns\n", demoHostRef)
	d.say("           the same action, key %s; delivered under it, the service answers from its receipt -> %s\n", key, line)
	return 1, nil
}

// demoHost is a running host process of the demo.
type demoHost struct {
	cmd *exec.Cmd
	sc  *bufio.Scanner
}

func (d *demo) startHost(ctx context.Context, url string) (*demoHost, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, exe, "demo-host", "--dir", d.dir, url)
	cmd.Env = append(os.Environ(), demoChildEnv+"=1")
	cmd.Stderr = d.a.stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the demo's host: %w", err)
	}
	return &demoHost{cmd: cmd, sc: bufio.NewScanner(out)}, nil
}

func (h *demoHost) line() (string, error) {
	if !h.sc.Scan() {
		h.kill()
		return "", fmt.Errorf("the demo's host ended early (%v)", h.sc.Err())
	}
	return h.sc.Text(), nil
}

// approved reads the key the host approved under.
func (h *demoHost) approved() (string, error) {
	l, err := h.line()
	if err != nil {
		return "", err
	}
	key, ok := strings.CutPrefix(l, "approved ")
	if !ok {
		h.kill()
		return "", fmt.Errorf("the demo's host said %q", l)
	}
	return key, nil
}

func (h *demoHost) kill() {
	_ = h.cmd.Process.Kill()
	_ = h.cmd.Wait()
}

// demoHostCmd is the demo's agent host process: it approves the refund in
// its journal, delivers it to the service at URL and prints the answer.
// Hidden; it runs only with demoChildEnv set.
func (a *app) demoHostCmd() *cobra.Command {
	return &cobra.Command{
		Use:     "demo-host URL",
		Short:   "The demo's agent host process (internal)",
		Example: "  (run by receiptctl demo only)",
		Hidden:  true,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if os.Getenv(demoChildEnv) != "1" || a.dir == "" {
				return usagef("demo-host is run by the demo only")
			}
			return a.demoHost(cmd.Context(), args[0])
		},
	}
}

func (a *app) demoHost(ctx context.Context, url string) error {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	j, err := intents.Open(filepath.Join(a.dir, demoHostDir), &intents.Options{Logger: quiet})
	if err != nil {
		return err
	}
	defer j.Close()
	d, err := intents.NewDispatcher(j, intents.DispatcherOptions{
		Transports: map[string]intents.Transport{"travel-api": &intents.HTTPTransport{BaseURL: url}},
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
	})
	if err != nil {
		return err
	}
	defer d.Close()
	act, err := j.Approve(ctx, intents.Approval{Target: "travel-api", Operation: "POST /v1/refunds",
		Arguments: refund.args, ApprovedBy: "traveller", Ref: demoHostRef, Deadline: time.Now().Add(demoTimeout)})
	if err != nil {
		return err
	}
	fmt.Fprintf(a.stdout, "approved %s\n", act.Key)
	wctx, cancel := context.WithTimeout(ctx, demoTimeout)
	defer cancel()
	done, err := j.Wait(wctx, act.Key)
	if err != nil {
		return err
	}
	if done.State != intents.Succeeded {
		return fmt.Errorf("the refund ended %s: %s", done.State, done.LastError)
	}
	fmt.Fprintf(a.stdout, "%s\n", done.Answer.Body)
	return nil
}
