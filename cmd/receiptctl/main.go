// Command receiptctl inspects a receipts store: offline on its directory
// (--dir), or live in a running service that mounts receiptadmin.Handler
// (--addr). Its demo command plays an agent whose tool calls are retried,
// raced and crashed against a fresh store.
//
//	receiptctl demo
//	receiptctl --dir ./data ls --abandoned
//	receiptctl --addr http://127.0.0.1:8081/admin/receipts get acct_7 op-42
//
// Exit codes: 0 ok, 1 not found or problems found, 2 bad input (usage, or a
// key or filter the store refuses).
package main

import (
	"context"
	"os"
	"os/signal"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := runContext(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
