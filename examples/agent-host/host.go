package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/receiptstore/receipts/intents"
	"github.com/receiptstore/receipts/intents/intentsmcp"
)

// runID names the agent's run. With an agent SDK it is the run's or the
// thread's id; the approval's Ref is runID/callID (see the README).
const runID = "run-1"

// toolCall is one tool call the model proposes.
type toolCall struct {
	ID   string         // the model's tool call id
	Tool string         // the tool
	Args map[string]any // its arguments
}

func (c toolCall) String() string {
	b, _ := json.Marshal(c.Args)
	return fmt.Sprintf("%s(%s) [%s]", c.Tool, b, c.ID)
}

// script is the scripted model: the tool calls it proposes, in order, for
// "Book me on LH 401 on 24 December and email me the itinerary".
var script = []toolCall{
	{"call_1", "book_flight", map[string]any{"flight": "LH 401", "date": "2026-12-24"}},
	{"call_2", "charge_card", map[string]any{"amount_cents": 129900, "currency": "EUR"}},
	{"call_3", "send_email", map[string]any{"to": "alice@example.invalid", "template": "itinerary"}},
}

// runState is the agent's run state, as an agent SDK persists it (OpenAI
// Agents' RunState, LangGraph's checkpoint): here, the person's decisions
// by tool call id. The keys are not in it: they are in the journal.
type runState struct {
	Decisions map[string]string `json:"decisions"` // call id → "approved" or "declined"
}

// hostOptions are the host process's settings.
type hostOptions struct {
	dir         string // journal and run state
	service     string // the MCP endpoint
	crashBefore string // a tool whose first call hangs before it is sent (the orchestrator kills the host there)
}

// runHost is one life of the host: it resumes what the journal holds,
// goes on with the model's script, asks the person (a line on in per
// question) and prints what happens on w.
func runHost(ctx context.Context, w io.Writer, in io.Reader, o hostOptions) error {
	say := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	j, err := intents.Open(filepath.Join(o.dir, "journal"), &intents.Options{Logger: quiet})
	if err != nil {
		return err
	}
	defer j.Close()
	client := mcp.NewClient(&mcp.Implementation{Name: "agent-host"}, nil)
	tr := intentsmcp.New(func(ctx context.Context) (*mcp.ClientSession, error) {
		return client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: o.service}, nil)
	}, nil)
	defer tr.Close()

	an := &announcer{ready: map[string]chan struct{}{}}
	for a, err := range j.List(ctx, intents.Approved) {
		if err != nil {
			return err
		}
		say("host: resuming %s [%s], approved by %s, not answered yet: same key %s", a.Operation, a.Ref, a.ApprovedBy, a.Key)
	}
	d, err := intents.NewDispatcher(j, intents.DispatcherOptions{
		Transports: map[string]intents.Transport{"travel": &announce{tr: tr, w: w, hang: o.crashBefore, an: an}},
		Logger:     quiet,
	})
	if err != nil {
		return err
	}
	defer d.Close()

	st, err := loadState(o.dir)
	if err != nil {
		return err
	}
	answers := bufio.NewScanner(in)
	var results []string
	for _, call := range script {
		ref := runID + "/" + call.ID
		decision := st.Decisions[call.ID]
		asked := decision == ""
		if asked {
			say("model: %s", call)
			say("ASK alice, approve %s? [y/n]", call.Tool)
			if !answers.Scan() {
				return errors.New("no answer from the person")
			}
			decision = "declined"
			if strings.TrimSpace(answers.Text()) == "y" {
				decision = "approved"
			}
		}
		if st.Decisions[call.ID] == "" {
			// The decision goes into the run state first, as an agent SDK
			// records an approval in its run state before it runs the tool.
			st.Decisions[call.ID] = decision
			if err := st.save(o.dir); err != nil {
				return err
			}
			if decision == "declined" {
				say("host: declined: nothing is sent")
			}
		}
		if decision == "declined" {
			results = append(results, call.Tool+": declined by alice")
			continue
		}
		// Approve with the call's Ref: the first time, a new action with a
		// new key; again (a restart between the run state and the journal),
		// the same action and key.
		a, err := j.Approve(ctx, intents.Approval{Target: "travel", Operation: call.Tool, Arguments: call.Args,
			ApprovedBy: "alice", Ref: ref})
		if err != nil {
			return err
		}
		if asked {
			say("host: approved: %s is action %s, durable before anything is sent", ref, a.Key)
		}
		an.say(a.Key)
		done, err := j.Wait(ctx, a.Key)
		if err != nil {
			return err
		}
		body := ""
		if done.Answer != nil {
			var res struct {
				StructuredContent json.RawMessage `json:"structuredContent"`
			}
			_ = json.Unmarshal(done.Answer.Body, &res)
			body = string(res.StructuredContent)
		}
		replayed := ""
		if done.Answer != nil && done.Answer.Replayed {
			replayed = " (a replay: the service answered from its receipt)"
		}
		say("host: %s %s: %s%s", call.Tool, done.State, body, replayed)
		results = append(results, fmt.Sprintf("%s: %s %s", call.Tool, done.State, body))
	}
	say("model: done. %s", strings.Join(results, "; "))
	return nil
}

// announce is the MCP transport, saying what it sends. It sends an action
// once the agent loop has reached it, so that the lines come in one order
// (the Dispatcher alone would resume at once); with hang, the calls of
// that tool hang before they are sent.
type announce struct {
	tr   *intentsmcp.Transport
	w    io.Writer
	hang string
	an   *announcer
}

func (t *announce) Deliver(ctx context.Context, a *intents.Action) (*intents.Answer, error) {
	select {
	case <-t.an.ch(a.Key):
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	fmt.Fprintf(t.w, "host: calling %s under key %s\n", a.Operation, a.Key)
	if a.Operation == t.hang {
		<-ctx.Done() // until the orchestrator's SIGKILL
		return nil, ctx.Err()
	}
	return t.tr.Deliver(ctx, a)
}

// announcer orders the host's lines: a call is printed after its action.
type announcer struct {
	mu    sync.Mutex
	ready map[string]chan struct{} // closed once the action was printed
}

func (an *announcer) ch(key string) chan struct{} {
	an.mu.Lock()
	defer an.mu.Unlock()
	c, ok := an.ready[key]
	if !ok {
		c = make(chan struct{})
		an.ready[key] = c
	}
	return c
}

func (an *announcer) said(key string) bool {
	select {
	case <-an.ch(key):
		return true
	default:
		return false
	}
}

func (an *announcer) say(key string) {
	if !an.said(key) {
		close(an.ch(key))
	}
}

func loadState(dir string) (*runState, error) {
	st := &runState{Decisions: map[string]string{}}
	b, err := os.ReadFile(filepath.Join(dir, "runstate.json"))
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return nil, err
	}
	return st, json.Unmarshal(b, st)
}

// save writes the run state (a new file renamed over the old one).
func (st *runState) save(dir string) error {
	b, err := json.Marshal(st)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "runstate.json.tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "runstate.json"))
}
