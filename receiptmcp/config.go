package receiptmcp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// DefaultMetaKey is the params._meta entry that carries the operation key
// when Config.MetaKey is empty.
const DefaultMetaKey = "dev.receipts/operationKey"

// DefaultReplayMetaKey is the result _meta entry (value true) that marks a
// replayed result when Config.ReplayMetaKey is empty.
const DefaultReplayMetaKey = "dev.receipts/replayed"

// The result _meta entries that say, on a replayed result, how old it is
// and how long it lasts (receipthttp's Idempotency-Recorded-At and
// Idempotency-Expires-At headers). Their values are RFC 3339 timestamps in
// UTC (time.RFC3339Nano).
const (
	// RecordedAtMetaKey is when the original result was recorded (the
	// receipt's UpdatedAt).
	RecordedAtMetaKey = "dev.receipts/recordedAt"
	// ExpiresAtMetaKey is until when the operation key stays protected:
	// until then every retry with it gets this result replayed (the
	// receipt's ExpiresAt, the recording plus the store's Retention); after
	// it, a call with the key runs the tool as a new call.
	ExpiresAtMetaKey = "dev.receipts/expiresAt"
)

// DefaultWait is how long a duplicate call waits for the call in progress
// under the same key when Config.Wait is zero.
const DefaultWait = 5 * time.Second

// Policy says whether a tool's calls go through the engine.
type Policy uint8

// Policies. The zero Policy means "not set": the tool gets Config.Default,
// and a zero Config.Default means Optional.
const (
	// Skip passes every call through untouched, with or without a key.
	// Right for read-only tools.
	Skip Policy = iota + 1
	// Optional runs calls that carry an operation key once per key and
	// passes calls without one through.
	Optional
	// Required rejects calls without an operation key with an
	// invalid-params error (data.type "idempotency_key_missing").
	Required
)

// String returns "skip", "optional", "required" (or "unset" for zero).
func (p Policy) String() string {
	switch p {
	case 0:
		return "unset"
	case Skip:
		return "skip"
	case Optional:
		return "optional"
	case Required:
		return "required"
	}
	return fmt.Sprintf("Policy(%d)", uint8(p))
}

// PolicyFor derives a tool's default policy from its annotations: Skip for a
// read-only tool (ReadOnlyHint), Optional for an idempotent one
// (IdempotentHint: repeating it does no harm, so a key is welcome but not
// demanded), Required for everything else, including a tool without
// annotations (MCP's defaults: not read-only, destructive, not idempotent).
func PolicyFor(t *mcp.Tool) Policy {
	switch {
	case t == nil || t.Annotations == nil:
		return Required
	case t.Annotations.ReadOnlyHint:
		return Skip
	case t.Annotations.IdempotentHint:
		return Optional
	}
	return Required
}

// PoliciesFor returns PolicyFor of each tool, by tool name: a ready
// Config.Policies for the tools a server adds.
func PoliciesFor(tools ...*mcp.Tool) map[string]Policy {
	m := make(map[string]Policy, len(tools))
	for _, t := range tools {
		if t != nil {
			m[t.Name] = PolicyFor(t)
		}
	}
	return m
}

// Config configures Middleware. The zero Config is usable over
// authenticated transports (streamable HTTP behind auth.RequireBearerToken):
// every tool is Optional and the scope is the bearer token's UserID.
type Config struct {
	// MetaKey is the params._meta entry that carries the operation key,
	// a string. Default DefaultMetaKey. It must have a reverse-DNS prefix
	// ("example.com/" style, written "com.example/name"), and no prefix label
	// may be "mcp" or "modelcontextprotocol": those are reserved for the
	// protocol.
	MetaKey string

	// ReplayMetaKey is the result _meta entry set to true on a replayed
	// result. Default DefaultReplayMetaKey; same rules as MetaKey.
	ReplayMetaKey string

	// Scope returns the authenticated principal a call belongs to: the
	// scope of its operation key, so that two principals using the same key
	// never see each other's receipts. It must come from authentication,
	// never from anything the client chose. An error (or "") rejects the
	// call.
	//
	// Default: req.Extra.TokenInfo.UserID when the transport authenticated
	// the call with a bearer token (a token without a UserID is rejected);
	// FixedScope when there is no token at all (stdio, in-memory); otherwise
	// the call is rejected (data.type "idempotency_scope_missing").
	Scope func(ctx context.Context, req *mcp.CallToolRequest) (string, error)

	// FixedScope is the scope of calls that arrive without a bearer token,
	// for transports where the process itself is the principal (stdio: one
	// client per server process). Leave it empty on HTTP.
	FixedScope string

	// Policies gives the policy of each tool by name (see PoliciesFor).
	Policies map[string]Policy

	// Default is the policy of tools not in Policies. Zero means Optional.
	Default Policy

	// Wait bounds how long a call waits for a call in progress under the
	// same key (by another client, or an earlier attempt of this one) to
	// finish, then replays its result. After that the call fails with an
	// application error (CodeInProgress, data.type
	// "idempotency_key_in_progress") carrying a retry-after. Zero means
	// DefaultWait; negative means do not wait.
	Wait time.Duration

	// LeaseFor is the lease length of each call's claim
	// (receipts.LeaseFor), renewed every third of it while the tool runs;
	// zero means the store's Options.LeaseTTL. Set it for tools that take
	// much longer (or less) than that. It must be less than the store's
	// Retention: Middleware panics otherwise.
	LeaseFor time.Duration

	// Logger receives what cannot be returned to the client: a receipt that
	// could not be recorded, a claim that could not be released. Default
	// slog.Default().
	Logger *slog.Logger
}

// config is a validated Config with defaults filled in.
type config struct {
	Config
	wait time.Duration // <= 0: do not wait
}

func (c Config) resolve() (*config, error) {
	r := &config{Config: c}
	if r.MetaKey == "" {
		r.MetaKey = DefaultMetaKey
	}
	if r.ReplayMetaKey == "" {
		r.ReplayMetaKey = DefaultReplayMetaKey
	}
	if err := validateMetaKey(r.MetaKey); err != nil {
		return nil, fmt.Errorf("receiptmcp: Config.MetaKey: %w", err)
	}
	if err := validateMetaKey(r.ReplayMetaKey); err != nil {
		return nil, fmt.Errorf("receiptmcp: Config.ReplayMetaKey: %w", err)
	}
	if r.MetaKey == r.ReplayMetaKey {
		return nil, errors.New("receiptmcp: Config.MetaKey and Config.ReplayMetaKey must differ")
	}
	if r.Default == 0 {
		r.Default = Optional
	}
	if r.Default > Required {
		return nil, fmt.Errorf("receiptmcp: Config.Default: unknown %s", r.Default)
	}
	for name, p := range r.Policies {
		if p > Required {
			return nil, fmt.Errorf("receiptmcp: Config.Policies[%q]: unknown %s", name, p)
		}
	}
	switch {
	case c.Wait == 0:
		r.wait = DefaultWait
	case c.Wait > 0:
		r.wait = c.Wait
	}
	if r.Logger == nil {
		r.Logger = slog.Default()
	}
	return r, nil
}

func (c *config) policy(tool string) Policy {
	if p := c.Policies[tool]; p != 0 {
		return p
	}
	return c.Default
}

// validateMetaKey checks that key is "prefix/name" with a reverse-DNS prefix
// that the MCP specification does not reserve.
func validateMetaKey(key string) error {
	i := strings.LastIndexByte(key, '/')
	if i <= 0 || i == len(key)-1 {
		return fmt.Errorf("%q is not of the form \"com.example/name\"", key)
	}
	for _, label := range strings.Split(key[:i], ".") {
		if label == "" {
			return fmt.Errorf("%q has an empty prefix label", key)
		}
		if l := strings.ToLower(label); l == "mcp" || l == "modelcontextprotocol" {
			return fmt.Errorf("%q uses a prefix reserved for MCP itself", key)
		}
	}
	return nil
}
