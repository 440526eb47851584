// Package intents is the host half of exactly-once actions: the
// application that asks (an agent host, a job runner, any Go client) turns
// each approval into a durable action with its own operation key, and
// delivers it with that key until the service answers.
//
//	approve ─→ key ─→ deliver (retry, same key) ─→ answer
//	  │         │        │                          │
//	  │         │        └ at-least-once, backoff,  └ recorded: succeeded,
//	  │         │          Retry-After, 409, a        failed, conflict,
//	  │         │          deadline                   expired; or uncertain
//	  │         └ UUIDv7, durable with the request before Approve returns
//	  └ a person (or a policy) said yes, once
//
// The service half is package receipts behind receipthttp or receiptmcp:
// it runs each key once and replays its answer to every retry. Together:
// delivery is at-least-once with a stable key, and the service executes at
// most once per key, so the effect happens once, through crashes on either
// side.
//
// See docs/host.md for the whole story.
package intents
