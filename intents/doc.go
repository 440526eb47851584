// Package intents is the host half of exactly-once actions: the application
// that asks (an agent host, a job runner, any Go client) turns each
// approval into a durable action with its own operation key, and delivers
// it with that key until the service answers.
//
//	approve ──▶ key ──▶ deliver (retries, same key) ──▶ answer
//	            │                                       │
//	            └ UUIDv7, durable with the request      └ succeeded, failed, conflict,
//	              before Approve returns                  expired; or uncertain at the
//	                                                      deadline, for a person
//
// The service half is package receipts behind receipthttp or receiptmcp: it
// runs each key once and answers every retry from its receipt. Together,
// delivery is at-least-once with a stable key and execution at most once
// per key, so the effect happens once, through crashes on either side.
//
// # Use
//
//	journal, _ := intents.Open(dir, nil) // or intentspg.Open(ctx, pool, nil)
//	d, _ := intents.NewDispatcher(journal, intents.DispatcherOptions{
//		Transports: map[string]intents.Transport{
//			"billing": &intents.HTTPTransport{BaseURL: "https://billing.internal"},
//		},
//	})
//	a, err := journal.Approve(ctx, intents.Approval{
//		Target: "billing", Operation: "POST /v1/charges",
//		Arguments: charge, ApprovedBy: "alice", Ref: approvalID,
//	})
//	done, err := journal.Wait(ctx, a.Key)
//
// Approve mints the key and writes the action before it returns; every
// approval is a new action, even with the same arguments, except that an
// approval's Ref (the application's approval id, e.g. an agent SDK's) is
// unique: approving it again returns the same action and key. The
// Dispatcher delivers every Approved action through the Transport of its
// Target (HTTPTransport; intentsmcp.Transport for MCP), resumes them all
// after a restart, retries with backoff and jitter and at least the
// service's Retry-After, and records the answer (see State). An action
// whose deadline passes without an answer is Uncertain: listed, never
// dropped, never sent under another key; Settle and Redeliver resolve it.
// Several Dispatchers (hosts on one intentspg journal) share the work: one
// at a time delivers an action, under a lease in the journal
// (Action.Holder, Action.LeaseUntil), and a host that dies is replaced
// when its lease ends; Attempts counts every host's deliveries.
//
// # The journal
//
// The journal keeps each request and each answer: it is the host's own
// data, not the service's receipts, and holds what the arguments and
// answers hold. Open keeps it in an embedded Pebble directory (locked by
// one process; approvals and answers are synced writes); package intentspg
// keeps it in a PostgreSQL schema. Both implement Store, whose rules are
// written there.
//
// docs/host.md has the whole story, the agent SDKs' approval ids, and the
// crash harness that counts duplicate effects (tests/hostkill).
package intents
