package hostkill_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/internal/testkit"
	"github.com/receiptstore/receipts/pgstore"
	"github.com/receiptstore/receipts/receipthttp"
	"github.com/receiptstore/receipts/receiptmcp"
	"go.uber.org/goleak"
)

// Steps under SIGKILL (issue 45, "Proof"): TestStepsKill drives actions of three steps
// (Lease.Step) against the real service process (receipthttp's POST /v1/trips, receiptmcp's
// book_trip tool), on Pebble and PostgreSQL, and SIGKILLs and restarts the service at random
// moments while clients retry each action under its idempotency key until it is answered.
// Each step forwards its step key (Step.ProviderKey) to a provider, stepfx.log, that
// deduplicates by it: a call with a key it has seen applies nothing and answers with the
// first effect. The service logs, in stepruns.log, each run of a step's fn before its
// provider call, and each Step that returned (its run recorded, or replayed from the
// journal). Counted at the end:
//
//   - re-runs of recorded steps: a run of a step after its Step returned once (0);
//   - duplicate effects: a step with effects under two keys, or a run that was not told
//     Recovered although the provider had seen its key, i.e. an effect a provider without
//     deduplication would have applied twice (0);
//   - every answered action's steps are recorded (DB.Steps, read after the last kill) with
//     its provider's effects as results, and its answer is those effects in order;
//   - resumed actions: actions one of whose attempts replayed a recorded step (reported).
//
// CI runs stepsKillActions actions per variant; RECEIPTS_STEPS_ACTIONS=n sets the count.
//
//	go test -run TestStepsKill -v ./tests/hostkill
func TestStepsKill(t *testing.T) {
	for _, engine := range []string{"pebble", "pg"} {
		for _, wire := range []string{"http", "mcp"} {
			t.Run(wire+"/"+engine, func(t *testing.T) { runStepsKill(t, wire, engine) })
		}
	}
}

const (
	stepFxLog  = "stepfx.log"   // the provider: "intent step stepkey effect-id" per effect
	stepRunLog = "stepruns.log" // the service: "run intent step stepkey recovered keyID", "rec|replay intent step keyID"
)

// tripArgs are the arguments of a multi-step action.
type tripArgs struct {
	Intent string `json:"intent"`
}

// tripResult is the service's answer: each step's effect, in order.
type tripResult struct {
	Steps []string `json:"steps"`
}

var tripSteps = [3]string{"reserve", "charge", "notify"}

// stepper runs one step of an attempt's action: Lease.Step.
type stepper func(ctx context.Context, name string, fingerprint []byte, fn func(context.Context, *receipts.Step) ([]byte, error)) ([]byte, error)

// stepsService is the service's part for steps: the provider and the run log.
type stepsService struct {
	s    *service
	mu   sync.Mutex // the provider: one call at a time
	fx   *appender
	runs *appender
}

func (s *service) openSteps() (*stepsService, error) {
	ss := &stepsService{s: s}
	var err error
	if ss.fx, err = openLog(s.c.Dir, stepFxLog); err != nil {
		return nil, err
	}
	if ss.runs, err = openLog(s.c.Dir, stepRunLog); err != nil {
		return nil, err
	}
	return ss, nil
}

// provide is the provider's call: it deduplicates by the step key.
func (ss *stepsService) provide(intent string, i int, key string, recovered bool) (string, error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	lines, err := readLog(ss.s.c.Dir, stepFxLog)
	if err != nil {
		return "", err
	}
	for _, l := range lines {
		if len(l) == 4 && l[2] == key {
			if !recovered {
				if err := ss.runs.add("dup", intent, strconv.Itoa(i), key); err != nil {
					return "", err
				}
			}
			return l[3], nil
		}
	}
	id := fmt.Sprintf("fx-%s-%d-%x", intent, i, ss.s.rng.Uint32())
	return id, ss.fx.add(intent, strconv.Itoa(i), key, id)
}

// book runs the action's three steps.
func (ss *stepsService) book(ctx context.Context, step stepper, intent, keyID string) (tripResult, error) {
	var out tripResult
	for i, name := range tripSteps {
		ran := false
		res, err := step(ctx, name, nil, func(ctx context.Context, st *receipts.Step) ([]byte, error) {
			ran = true
			key := st.ProviderKey()
			if err := ss.runs.add("run", intent, strconv.Itoa(i), key, strconv.FormatBool(st.Recovered()), keyID); err != nil {
				return nil, err
			}
			ss.s.sleep()
			id, err := ss.provide(intent, i, key, st.Recovered())
			if err != nil {
				return nil, err
			}
			ss.s.sleep()
			return []byte(id), nil
		})
		if err != nil {
			return out, err
		}
		what := "replay"
		if ran {
			what = "rec"
		}
		if err := ss.runs.add(what, intent, strconv.Itoa(i), keyID); err != nil {
			return out, err
		}
		out.Steps = append(out.Steps, string(res))
	}
	return out, nil
}

// tripsHTTP is POST /v1/trips's handler, behind receipthttp's middleware.
func (ss *stepsService) tripsHTTP() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in tripArgs
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Intent == "" {
			http.Error(w, "an intent is needed", http.StatusBadRequest)
			return
		}
		a, _ := receipthttp.AttemptFrom(r.Context())
		step := a.Step
		res, err := ss.book(r.Context(), step, in.Intent, a.Key.ID)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(res)
	})
}

// bookTripMCP is the book_trip tool, behind receiptmcp's middleware.
func (ss *stepsService) bookTripMCP(ctx context.Context, _ *mcp.CallToolRequest, in tripArgs) (*mcp.CallToolResult, tripResult, error) {
	a, _ := receiptmcp.AttemptFrom(ctx)
	step := a.Step
	res, err := ss.book(ctx, step, in.Intent, a.Key.ID)
	if err != nil {
		return nil, tripResult{}, err
	}
	return nil, res, nil
}

// stepsKillActions is the number of actions per variant.
func stepsKillActions() int {
	n := stepsKillActionsCI
	if testkit.Soak() {
		n = 400
	}
	return testkit.EnvInt("RECEIPTS_STEPS_ACTIONS", n)
}

func runStepsKill(t *testing.T, wire, engine string) {
	leaks := goleak.IgnoreCurrent()
	defer goleak.VerifyNone(t, leaks)
	seed := testkit.Seed(t)
	rng := rand.New(rand.NewPCG(seed, 0x57e95))
	c := config{Dir: t.TempDir(), Wire: wire, Engine: engine, Port: freePort(t), Seed: seed}
	if engine == "pg" {
		c.DSN, c.SvcSchema = pgtest.Schema(t)
	}
	begin := time.Now()
	svcConf := c
	svcConf.Role = "service"
	svc := start(t, svcConf)
	svc.await(t, "READY", time.Minute)
	defer func() { svc.kill() }()

	n := stepsKillActions()
	intents := make([]string, n)
	for i := range intents {
		intents[i] = fmt.Sprintf("trip%d", i)
	}
	answers := make([]*tripResult, n)
	var next, done, failed atomic.Int64
	// The second half of the actions waits for the first SIGKILL, so that a fast machine
	// cannot finish them all before one lands (the run would test no kill).
	var killed atomic.Bool
	var wg sync.WaitGroup
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	base := fmt.Sprintf("http://127.0.0.1:%d", c.Port)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := &stepsClient{wire: wire, base: base}
			defer cl.close()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				for i >= n/2 && !killed.Load() && ctx.Err() == nil {
					time.Sleep(5 * time.Millisecond)
				}
				for ctx.Err() == nil {
					res, err := cl.call(ctx, intents[i])
					if err == nil {
						answers[i] = res
						break
					}
					time.Sleep(20 * time.Millisecond)
				}
				if answers[i] == nil {
					failed.Add(1)
				}
				done.Add(1)
			}
		}()
	}
	kills := 0
	for done.Load() < int64(n) && ctx.Err() == nil {
		pause := 10 + rng.IntN(120) // ms after the service is up: kills land inside steps
		if engine == "pg" {
			pause = 50 + rng.IntN(400) // a PostgreSQL attempt's steps take longer
		}
		time.Sleep(time.Duration(pause) * time.Millisecond)
		if done.Load() >= int64(n) {
			break
		}
		svc.kill() // SIGKILL, at a random moment of the actions in flight
		kills++
		killed.Store(true)
		svcConf.OffsetHours++ // the restarted service finds the dead one's leases run out
		svcConf.Seed = rng.Uint64()
		svc = start(t, svcConf)
		svc.await(t, "READY", time.Minute)
	}
	wg.Wait()
	svc.kill()
	if failed.Load() > 0 {
		t.Fatalf("%d actions got no answer in time", failed.Load())
	}

	r, err := analyzeSteps(context.Background(), c, intents, answers)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s on %s: %d actions of 3 steps in %s, %d SIGKILLs of the service; %d step runs (%d told Recovered); re-runs of recorded steps %d, duplicate effects %d; resumed actions %d (an attempt replayed a recorded step)",
		wire, engine, n, time.Since(begin).Round(time.Millisecond), kills, r.runs, r.recovered, r.reruns, r.dups, r.resumed)
	if len(r.problems) > 0 {
		t.Fatalf("violations (seed %d):\n%s", seed, strings.Join(r.problems, "\n"))
	}
	if kills == 0 {
		t.Fatalf("run too thin: no kill")
	}
}

// stepsReport is what analyzeSteps counted.
type stepsReport struct {
	runs, recovered, reruns, dups, resumed int
	problems                               []string
}

func (r *stepsReport) problem(format string, args ...any) {
	if len(r.problems) < 20 {
		r.problems = append(r.problems, fmt.Sprintf(format, args...))
	}
}

// analyzeSteps reads the logs and the service's store (no service runs).
func analyzeSteps(ctx context.Context, c config, intents []string, answers []*tripResult) (*stepsReport, error) {
	r := &stepsReport{}
	runs, err := readLog(c.Dir, stepRunLog)
	if err != nil {
		return nil, err
	}
	fx, err := readLog(c.Dir, stepFxLog)
	if err != nil {
		return nil, err
	}
	type sk struct {
		intent string
		step   string
	}
	returned := map[sk]bool{}
	resumed := map[string]bool{}
	keyIDs := map[string]string{}
	for _, l := range runs {
		switch {
		case l[0] == "run" && len(l) == 6:
			r.runs++
			if l[4] == "true" {
				r.recovered++
			}
			if returned[sk{l[1], l[2]}] {
				r.reruns++
				r.problem("%s step %s ran again after its Step returned", l[1], l[2])
			}
			keyIDs[l[1]] = l[5]
		case (l[0] == "rec" || l[0] == "replay") && len(l) == 4:
			returned[sk{l[1], l[2]}] = true
			if l[0] == "replay" {
				resumed[l[1]] = true
			}
			keyIDs[l[1]] = l[3]
		case l[0] == "dup" && len(l) == 4:
			r.dups++
			r.problem("%s step %s: a run not told Recovered called the provider with a key it had seen (%s)", l[1], l[2], l[3])
		default:
			return nil, fmt.Errorf("%s: bad line %q", stepRunLog, l)
		}
	}
	r.resumed = len(resumed)
	effects := map[sk][]string{} // effect ids
	keys := map[sk]string{}
	for _, l := range fx {
		if len(l) != 4 {
			return nil, fmt.Errorf("%s: bad line %q", stepFxLog, l)
		}
		k := sk{l[0], l[1]}
		effects[k] = append(effects[k], l[3])
		if keys[k] != "" && keys[k] != l[2] {
			r.problem("%s step %s has effects under two step keys", l[0], l[1])
		}
		keys[k] = l[2]
	}
	for k, ids := range effects {
		if len(ids) > 1 {
			r.dups += len(ids) - 1
			r.problem("%s step %s has %d effects at the provider", k.intent, k.step, len(ids))
		}
	}

	db, closeDB, err := openServiceStore(ctx, c)
	if err != nil {
		return nil, err
	}
	defer closeDB()
	for i, intent := range intents {
		a := answers[i]
		if a == nil {
			continue
		}
		if len(a.Steps) != 3 {
			r.problem("%s: answered %+v", intent, a)
			continue
		}
		for j := range 3 {
			ids := effects[sk{intent, strconv.Itoa(j)}]
			if len(ids) == 0 || a.Steps[j] != ids[0] {
				r.problem("%s: step %d answered %q, its provider's effects %v", intent, j, a.Steps[j], ids)
			}
		}
		steps, err := db.Steps(ctx, receipts.Key{Scope: "host-1", ID: keyIDs[intent]})
		if err != nil {
			r.problem("%s: DB.Steps: %v", intent, err)
			continue
		}
		if len(steps) != 3 {
			r.problem("%s: DB.Steps has %d steps", intent, len(steps))
			continue
		}
		for j, s := range steps {
			if s.State != receipts.Succeeded || string(s.Result) != a.Steps[j] || s.ProviderKey != keys[sk{intent, strconv.Itoa(j)}] {
				r.problem("%s: step %d recorded %s %q with key %s; answered %q, provider key %s", intent, j, s.State, s.Result, s.ProviderKey, a.Steps[j], keys[sk{intent, strconv.Itoa(j)}])
			}
		}
	}
	return r, nil
}

// openServiceStore opens the service's store in the test process (after the last kill).
func openServiceStore(ctx context.Context, c config) (*receipts.DB, func(), error) {
	opts := receipts.Options{
		Retention:  30 * 24 * time.Hour,
		Now:        func() time.Time { return time.Now().Add(time.Duration(c.OffsetHours+1) * time.Hour) },
		Logger:     slog.New(slog.NewTextHandler(io.Discard, nil)),
		GCInterval: -1,
	}
	if c.Engine == "pebble" {
		db, err := receipts.Open(filepath.Join(c.Dir, "service"), &opts)
		if err != nil {
			return nil, nil, err
		}
		return db, func() { _ = db.Close() }, nil
	}
	pool, err := pgxpool.New(ctx, c.DSN)
	if err != nil {
		return nil, nil, err
	}
	db, err := pgstore.Open(ctx, pool, &pgstore.Options{Options: opts, Schema: c.SvcSchema})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return db, func() { _ = db.Close(); pool.Close() }, nil
}

// stepsClient calls the service: HTTP with an Idempotency-Key, or MCP with the key in _meta.
type stepsClient struct {
	wire, base string
	hc         http.Client
	session    *mcp.ClientSession
}

func (cl *stepsClient) close() {
	if cl.session != nil {
		_ = cl.session.Close()
		cl.session = nil
	}
	cl.hc.CloseIdleConnections()
}

// call sends one attempt of intent's action; an error means: try again.
func (cl *stepsClient) call(ctx context.Context, intent string) (*tripResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	body, _ := json.Marshal(tripArgs{Intent: intent})
	key := "key-" + intent
	var res tripResult
	if cl.wire == "http" {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, cl.base+"/v1/trips", bytes.NewReader(body))
		if err != nil {
			return nil, err
		}
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := cl.hc.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusCreated {
			return nil, fmt.Errorf("status %d: %s", resp.StatusCode, b)
		}
		if err := json.Unmarshal(b, &res); err != nil {
			return nil, err
		}
		return &res, nil
	}
	if cl.session == nil {
		client := mcp.NewClient(&mcp.Implementation{Name: "steps-client"}, nil)
		s, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: cl.base}, nil)
		if err != nil {
			return nil, err
		}
		cl.session = s
	}
	out, err := cl.session.CallTool(ctx, &mcp.CallToolParams{
		Meta:      mcp.Meta{receiptmcp.DefaultMetaKey: key},
		Name:      "book_trip",
		Arguments: json.RawMessage(body),
	})
	if err != nil {
		cl.close() // the session may have died with the service: start a new one
		return nil, err
	}
	if out.IsError {
		return nil, fmt.Errorf("tool error: %+v", out.Content)
	}
	b, err := json.Marshal(out.StructuredContent)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return nil, err
	}
	if len(res.Steps) == 0 {
		return nil, errors.New("an answer without steps")
	}
	return &res, nil
}
