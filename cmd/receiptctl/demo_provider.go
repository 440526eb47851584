package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// provider is the demo's external service (a payment or booking API). Every
// call it performs is an effect, appended to a log file and synced before it
// answers. It is deliberately naive: it performs every call it gets, twice
// if asked twice, so any duplicate would show in its log. It answers one
// question besides: whether it already performed a call with a given
// idempotency key (what real providers offer for reconciliation).
type provider struct {
	path string
	mu   sync.Mutex // serializes appends from this process
}

// effect is one line of the provider's log.
type effect struct {
	IdempotencyKey string         `json:"idempotency_key"`
	Confirmation   string         `json:"confirmation"`
	Tool           string         `json:"tool"`
	Args           map[string]any `json:"args"`
}

// declinedError is the provider's definitive refusal: nothing happened, and
// asking again will not change it.
type declinedError struct{ reason string }

func (e *declinedError) Error() string { return e.reason }

// latency is how long the provider takes to perform a call: long enough for
// racing callers to overlap.
const latency = 40 * time.Millisecond

// perform performs c, keyed by idempotencyKey, and returns its confirmation.
func (p *provider) perform(ctx context.Context, idempotencyKey string, c toolCall) (string, error) {
	select {
	case <-time.After(latency):
	case <-ctx.Done():
		return "", ctx.Err()
	}
	if to, _ := c.args["to"].(string); strings.HasSuffix(to, ".invalid") {
		return "", &declinedError{reason: "mailbox " + to + " unavailable"}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	effects, err := p.effects()
	if err != nil {
		return "", err
	}
	e := effect{IdempotencyKey: idempotencyKey, Confirmation: fmt.Sprintf("conf-%04d", len(effects)+1), Tool: c.tool, Args: c.args}
	line, err := json.Marshal(e)
	if err != nil {
		return "", err
	}
	f, err := os.OpenFile(p.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return "", err
	}
	_, err = f.Write(append(line, '\n'))
	if serr := f.Sync(); err == nil {
		err = serr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("provider: %w", err)
	}
	return e.Confirmation, nil
}

// lookup returns the confirmation of the call performed with idempotencyKey.
func (p *provider) lookup(idempotencyKey string) (string, bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	effects, err := p.effects()
	if err != nil {
		return "", false, err
	}
	for _, e := range effects {
		if e.IdempotencyKey == idempotencyKey {
			return e.Confirmation, true, nil
		}
	}
	return "", false, nil
}

// effects reads the log.
func (p *provider) effects() ([]effect, error) {
	f, err := os.Open(p.path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []effect
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var e effect
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("provider log %s: %w", p.path, err)
		}
		out = append(out, e)
	}
	return out, sc.Err()
}
