package hostkill_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/pgstore"
	"github.com/receiptstore/receipts/receipthttp"
	"github.com/receiptstore/receipts/receiptmcp"
)

// chargeArgs are the arguments of every action: the intent names the
// approval (the harness's own id, never a key); amount 0 is refused.
type chargeArgs struct {
	Intent string `json:"intent"`
	Amount int    `json:"amount"`
}

// chargeResult is the service's answer to a charge.
type chargeResult struct {
	Effect string `json:"effect"`
}

// service is the service child: a charge endpoint behind receipthttp or
// receiptmcp, whose effect is a line in effects.log.
type service struct {
	c        config
	effects  *appender
	requests *appender
	rng      *rand.Rand
	steps    *stepsService // TestStepsKill's actions of three steps
}

func runService(c config) error {
	ctx := context.Background()
	offset := time.Duration(c.OffsetHours) * time.Hour
	opts := receipts.Options{
		Now:       func() time.Time { return time.Now().Add(offset) },
		Retention: 30 * 24 * time.Hour,
		LeaseTTL:  2 * time.Second,
		Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	var db *receipts.DB
	var err error
	switch c.Engine {
	case "pebble":
		db, err = receipts.Open(filepath.Join(c.Dir, "service"), &opts)
	case "pg":
		var pool *pgxpool.Pool
		pool, err = pgxpool.New(ctx, c.DSN)
		if err == nil {
			db, err = pgstore.Open(ctx, pool, &pgstore.Options{Options: opts, Schema: c.SvcSchema})
		}
	default:
		err = fmt.Errorf("unknown engine %q", c.Engine)
	}
	if err != nil {
		return err
	}
	s := &service{c: c, rng: rand.New(rand.NewPCG(c.Seed, uint64(c.OffsetHours)))}
	if s.effects, err = openLog(c.Dir, effectsLog); err != nil {
		return err
	}
	if s.requests, err = openLog(c.Dir, requestsLog); err != nil {
		return err
	}
	if s.steps, err = s.openSteps(); err != nil {
		return err
	}
	var h http.Handler
	switch c.Wire {
	case "http":
		h, err = s.httpHandler(db)
	case "mcp":
		h = s.mcpHandler(db)
	default:
		err = fmt.Errorf("unknown wire %q", c.Wire)
	}
	if err != nil {
		return err
	}
	var ln net.Listener
	for range 100 { // the port of the killed service may take a moment to free
		ln, err = net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(c.Port))
		if err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	fmt.Println("READY")
	return http.Serve(ln, h) // until SIGKILL
}

// sleep pauses for up to 15 ms, so that kills land inside calls.
func (s *service) sleep() { time.Sleep(time.Duration(s.rng.IntN(15_000)) * time.Microsecond) }

// perform is the effect, once per key: a recovered attempt (an earlier
// one's outcome is unknown) first looks its key up in the effect log.
func (s *service) perform(intent, key string, token uint64, recovered bool) (string, error) {
	s.sleep()
	if recovered {
		lines, err := readLog(s.c.Dir, effectsLog)
		if err != nil {
			return "", err
		}
		for _, l := range lines {
			if len(l) == 3 && l[1] == key {
				return l[2], nil // it happened: answer with it
			}
		}
	}
	id := fmt.Sprintf("fx-%s-%d", intent, token)
	if err := s.effects.add(intent, key, id); err != nil {
		return "", err
	}
	s.sleep()
	return id, nil
}

func (s *service) httpHandler(db *receipts.DB) (http.Handler, error) {
	mw, err := receipthttp.New(db, receipthttp.Config{Scope: func(*http.Request) (string, error) { return "host-1", nil }})
	if err != nil {
		return nil, err
	}
	charges := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in chargeArgs
		if err := json.NewDecoder(r.Body).Decode(&in); err != nil || in.Amount <= 0 {
			http.Error(w, "amount must be positive", http.StatusBadRequest)
			return
		}
		a, _ := receipthttp.AttemptFrom(r.Context())
		id, err := s.perform(in.Intent, a.Key.ID, a.Token, a.Recovered)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(chargeResult{Effect: id})
	}))
	mux := http.NewServeMux()
	mux.Handle("POST /v1/charges", charges)
	mux.Handle("POST /v1/trips", mw(s.steps.tripsHTTP()))
	mux.HandleFunc("POST /v1/down", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "down", http.StatusServiceUnavailable)
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var in chargeArgs
		_ = json.Unmarshal(body, &in)
		if err := s.requests.add(in.Intent, r.Header.Get("Idempotency-Key")); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		mux.ServeHTTP(w, r)
	}), nil
}

func (s *service) mcpHandler(db *receipts.DB) http.Handler {
	server := mcp.NewServer(&mcp.Implementation{Name: "billing"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "charge"}, func(ctx context.Context, _ *mcp.CallToolRequest, in chargeArgs) (*mcp.CallToolResult, chargeResult, error) {
		if in.Amount <= 0 {
			return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "amount must be positive"}}}, chargeResult{}, nil
		}
		a, _ := receiptmcp.AttemptFrom(ctx)
		id, err := s.perform(in.Intent, a.Key.ID, a.Token, a.Recovered)
		if err != nil {
			return nil, chargeResult{}, err
		}
		return nil, chargeResult{Effect: id}, nil
	})
	mcp.AddTool(server, &mcp.Tool{Name: "book_trip"}, s.steps.bookTripMCP)
	mcp.AddTool(server, &mcp.Tool{Name: "down"}, func(context.Context, *mcp.CallToolRequest, chargeArgs) (*mcp.CallToolResult, chargeResult, error) {
		return nil, chargeResult{}, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "down"}
	})
	logRequests := func(next mcp.MethodHandler) mcp.MethodHandler {
		return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
			if call, ok := req.(*mcp.CallToolRequest); ok {
				var in chargeArgs
				_ = json.Unmarshal(call.Params.Arguments, &in)
				key, _ := call.Params.Meta[receiptmcp.DefaultMetaKey].(string)
				if err := s.requests.add(in.Intent, key); err != nil {
					return nil, err
				}
			}
			return next(ctx, method, req)
		}
	}
	server.AddReceivingMiddleware(logRequests, receiptmcp.Middleware(db, receiptmcp.Config{FixedScope: "host-1", Wait: time.Second}))
	return mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, &mcp.StreamableHTTPOptions{JSONResponse: true})
}
