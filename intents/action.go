package intents

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// State is where an action stands in the journal.
//
//	Approve ─→ Approved ─┬─→ Succeeded | Failed | Conflict | Expired   (an answer: final)
//	                     └─→ Uncertain ─┬─→ Succeeded | Failed | …      (Settle, or a late answer)
//	                                    └─→ Approved                    (Redeliver, same key)
//
// Approved is the only state a Dispatcher delivers. Uncertain is the only
// state that waits for a person or a reconcile hook. The answered states
// are final: only Forget removes them.
type State uint8

// The states of an action.
const (
	// Approved: approved and not answered yet. The Dispatcher delivers it,
	// with its key, until an answer or its deadline.
	Approved State = iota + 1
	// Succeeded: the service answered with a success (HTTP 2xx or 3xx; an
	// MCP tool result without isError). A replayed success counts the same.
	Succeeded
	// Failed: the service answered with a definitive failure that it keeps
	// (HTTP 4xx other than 408, 409, 410, 422, 425 and 429; an MCP tool
	// result with isError; an MCP error that says the request cannot be
	// served as sent). The action did not take effect and will not.
	Failed
	// Conflict: the service has this key for another request (HTTP 422;
	// MCP idempotency_key_conflict). The host never sends one key with two
	// requests, so this means a bug or a service that fingerprints
	// differently: look at it.
	Conflict
	// Expired: the service used this key, and its answer is no longer kept
	// (HTTP 410; MCP idempotency_key_expired): the key outlived the
	// service's retention. The effect happened at most once; what it was is
	// lost. Keep deadlines well below the service's retention.
	Expired
	// Uncertain: the deadline came with no definitive answer. The effect may
	// or may not have happened. The action is kept, with its key, for a
	// person or a reconcile hook: Settle records what happened, Redeliver
	// sends it again under the same key.
	Uncertain
)

var stateNames = [...]string{
	Approved:  "approved",
	Succeeded: "succeeded",
	Failed:    "failed",
	Conflict:  "conflict",
	Expired:   "expired",
	Uncertain: "uncertain",
}

// String returns the state's name: "approved", "succeeded", "failed",
// "conflict", "expired" or "uncertain".
func (s State) String() string {
	if s >= Approved && s <= Uncertain {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// ParseState returns the state named name (as String writes it).
func ParseState(name string) (State, error) {
	for s := Approved; s <= Uncertain; s++ {
		if stateNames[s] == name {
			return s, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown state %q (want approved, succeeded, failed, conflict, expired or uncertain)", ErrInvalid, name)
}

// Answered reports whether s is one of the states of a definitive answer:
// Succeeded, Failed, Conflict or Expired.
func (s State) Answered() bool { return s >= Succeeded && s <= Expired }

// Done reports whether a Dispatcher is done with an action in state s: it
// was answered, or it is Uncertain.
func (s State) Done() bool { return s.Answered() || s == Uncertain }

// MarshalText implements encoding.TextMarshaler (JSON shows the name).
func (s State) MarshalText() ([]byte, error) {
	if s < Approved || s > Uncertain {
		return nil, fmt.Errorf("intents: cannot marshal %v", s)
	}
	return []byte(s.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *State) UnmarshalText(b []byte) error {
	v, err := ParseState(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Approval is what a person (or a policy) approved: one action, to be done
// once.
type Approval struct {
	// Target names the service the action goes to: the key of the
	// Transport that delivers it in DispatcherOptions.Transports (for
	// example "billing-http" or "workitems-mcp"). Required.
	Target string
	// Operation is what to do at the target: an MCP tool's name, or an
	// HTTP method and path ("POST /v1/charges"). Required.
	Operation string
	// Arguments are the action's arguments: the tool's arguments, or the
	// HTTP request's JSON body. Any value encoding/json can encode; a
	// json.RawMessage or []byte is taken as JSON as it is and must be
	// valid. nil means none.
	Arguments any
	// ApprovedBy says who approved: a person's account, or the policy that
	// approved on their behalf. Required.
	ApprovedBy string
	// Ref is the approval's own id in the application, optional: an agent
	// SDK's approval or tool call id (see the package documentation). A
	// Ref is unique in the journal: Approve with a Ref the journal holds
	// returns the action approved under it, with its key, instead of a
	// new one, so a host that resumes a run and approves the same call
	// again does not make it a second action.
	Ref string
	// Deadline bounds delivery: after it, an action without an answer is
	// not sent again and turns Uncertain. Zero means
	// Options.DeliverFor after the approval. It must be in the future.
	// Keep it well below the service's retention (receipts'
	// Options.Retention, 24 hours by default): a retry after the service
	// forgot the key would be answered Expired.
	Deadline time.Time
}

// Action is an approved action as the journal keeps it: the request, which
// the host must be able to send again after a restart, its operation key,
// and where its delivery stands.
//
// The journal keeps the request (Target, Operation, Arguments) and the
// answer: it is the host's own data, and holds whatever the arguments and
// answers hold. Forget removes an answered action.
type Action struct {
	// Key is the action's operation key, a UUIDv7 minted by Approve. Every
	// delivery of the action carries it; no other action has it.
	Key string `json:"key"`
	// Target, Operation and Arguments are the request (see Approval).
	// Arguments are JSON ("null" when there were none).
	Target    string          `json:"target"`
	Operation string          `json:"operation"`
	Arguments json.RawMessage `json:"arguments"`
	// ApprovedBy and Ref are the Approval's.
	ApprovedBy string `json:"approved_by"`
	Ref        string `json:"ref,omitempty"`
	// ApprovedAt is when Approve recorded the action; Deadline, when
	// delivery ends.
	ApprovedAt time.Time `json:"approved_at"`
	Deadline   time.Time `json:"deadline"`
	// State is where the action stands.
	State State `json:"state"`
	// Attempts counts the deliveries of the action, by every host that
	// shares the journal: a Dispatcher counts each one in the journal as it
	// claims the action, before it sends it (a host that dies between the
	// two counts one delivery more than the service saw). It is
	// bookkeeping, written without waiting for the disk: after a crash of
	// the machine (or of PostgreSQL) it may count fewer than were made.
	Attempts uint32 `json:"attempts"`
	// Holder names the host that holds the action's delivery lease (its
	// DispatcherOptions.HostName), while the action is Approved: at most
	// one host delivers an action at a time. "" when none does (not picked
	// up yet, released by a Dispatcher's Close, or done).
	Holder string `json:"holder,omitempty"`
	// LeaseUntil is when Holder's lease ends: the end of its attempt in
	// flight, or of its wait before the next one, plus
	// DispatcherOptions.LeaseMargin. After it another host may take the
	// action over: that is how a host that died is replaced.
	LeaseUntil time.Time `json:"lease_until,omitzero"`
	// LastError is why the last attempt got no answer, or why the action
	// turned Uncertain.
	LastError string `json:"last_error,omitempty"`
	// UncertainStep names the step of the service's action whose outcome
	// the service last reported unknown, when it said which: an action of
	// several steps (receipts' Lease.Step) whose attempt died in that step.
	// The service's "outcome unknown" answer carries it (the "step" member
	// of an HTTP problem details body, the "step" of an MCP error's data;
	// a Transport reports it with a *StepError). The service resumes the
	// action at that step on the next delivery; a person settling an
	// Uncertain action asks the provider about that step. "" when the
	// service named none; cleared when the action is answered.
	UncertainStep string `json:"uncertain_step,omitempty"`
	// Answer is the service's answer, for an answered action (and for one
	// settled by Settle).
	Answer *Answer `json:"answer,omitempty"`
	// UpdatedAt is the time of the last change.
	UpdatedAt time.Time `json:"updated_at"`
}

// Answer is a service's definitive answer to an action.
type Answer struct {
	// State is what the answer means: Succeeded, Failed, Conflict or
	// Expired.
	State State `json:"state"`
	// Status is the HTTP status (0 over MCP).
	Status int `json:"status,omitempty"`
	// Header holds the HTTP response's header fields (nil over MCP).
	Header http.Header `json:"header,omitempty"`
	// Body is the HTTP response's body, or the MCP tool result (JSON), or
	// the JSON-RPC error's data over MCP; at most MaxAnswerSize bytes.
	Body []byte `json:"body,omitempty"`
	// Truncated reports that the body was longer than MaxAnswerSize and
	// was cut.
	Truncated bool `json:"truncated,omitempty"`
	// Code is the service's error type, when it says one: an RFC 9457
	// problem type, or the data.type of an MCP error
	// ("idempotency_key_conflict").
	Code string `json:"code,omitempty"`
	// Replayed reports that the service said the answer is a replay of a
	// stored one (Idempotent-Replayed: true; the MCP result's
	// _meta["dev.receipts/replayed"]). It is for people: nothing in this
	// package depends on it, since some clients and proxies drop it.
	Replayed bool `json:"replayed,omitempty"`
	// SettledBy is set when a person or a reconcile hook recorded the
	// answer with Journal.Settle, not the service: who did.
	SettledBy string `json:"settled_by,omitempty"`
	// At is when the answer was recorded.
	At time.Time `json:"at"`
}

// Limits on what an action holds.
const (
	// MaxArgumentsSize is the largest encoding of an action's arguments.
	MaxArgumentsSize = 1 << 20
	// MaxAnswerSize is the most of an answer's body that the journal keeps.
	MaxAnswerSize = 1 << 20
	// MaxFieldLen is the longest Target, Operation, ApprovedBy or Ref, in
	// bytes.
	MaxFieldLen = 1024
)

// clone returns a deep copy of a, so that callers never share what the
// journal holds.
func (a *Action) clone() *Action {
	if a == nil {
		return nil
	}
	c := *a
	c.Arguments = append(json.RawMessage(nil), a.Arguments...)
	if a.Answer != nil {
		ans := *a.Answer
		ans.Header = a.Answer.Header.Clone()
		ans.Body = append([]byte(nil), a.Answer.Body...)
		c.Answer = &ans
	}
	return &c
}
