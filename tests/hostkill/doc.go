// Package hostkill is the end-to-end crash harness of the two halves: a
// host (package intents: journal, Dispatcher, the HTTP or MCP transport)
// delivers approved actions to a service (receipthttp or receiptmcp on a
// receipts store), both in processes of their own, on Pebble and on
// PostgreSQL, over real sockets on 127.0.0.1.
//
// The test binary starts itself again as the service and as the host. The
// host approves a few actions per run (most succeed, some are refused by
// the service, some go to a route that is down until their short deadline
// passes) and is SIGKILLed at a random moment, or runs until every action
// is answered; the service is SIGKILLed and restarted now and then, also
// while the host is in a call. The service's handler sleeps before and
// after its effect, so kills land before the effect, between the effect
// and its receipt, and between the receipt and the host's record of the
// answer. A last host runs to the end. Then the logs and the journal are
// counted:
//
//   - effects.log, the service's own effect log (a recovered attempt looks
//     its key up there first, as a service with an external effect
//     reconciles): no action has two effects;
//   - approvals.log, written by the host after each Approve returned: no
//     approval is missing from the journal;
//   - requests.log, every request the service received with its key: no
//     action arrived under two keys, or under a key that is not its own;
//   - the journal: every action ends answered or Uncertain, a success has
//     exactly its one effect and its answer names it, a refusal or an
//     Uncertain action none.
//
// CI runs 25 host cycles per transport and engine (8 under -race):
//
//	go test -run TestHostKill -v ./tests/hostkill
//
// RECEIPTS_SOAK=1 runs 500 per variant; RECEIPTS_HOST_KILLS=n sets the
// count, RECEIPTS_SEED=n replays a run's choices.
//
// TestHostKillSharedJournal runs several host processes at once on one
// intentspg journal, one of them SIGKILLed per round, and also counts the
// deliveries the service received against each action's Attempts: one
// host delivers an action at a time, under its lease.
//
// TestStepsKill (steps_test.go) runs actions of three steps (Lease.Step) against the service
// (receipthttp's POST /v1/trips, receiptmcp's book_trip), on Pebble and PostgreSQL, and
// SIGKILLs the service at random moments while clients retry: each step forwards its step key
// to a provider that deduplicates by it; it reports re-runs of recorded steps and duplicate
// effects (both must be 0) and the number of resumed actions (RECEIPTS_STEPS_ACTIONS=n sets
// the actions per variant).
package hostkill
