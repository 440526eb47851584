package model_test

import (
	"path/filepath"
	"testing"

	"github.com/receiptstore/receipts/internal/testkit"
	"github.com/receiptstore/receipts/keyring"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// modelKeyring is the key file of TestModelPrivacy's stores (one for all: each store has
// its own scopes' data keys, named under its own secret).
var modelKeyring *keyring.File

// TestModelPrivacy is TestModel with results encrypted (Options.Keyring) and scopes erased
// (EraseScope) among the other actions: every answer must be the model's, replays and
// mismatches and tombstones as without encryption, and an erased scope's keys refused (and
// its records gone) until the erasure's end, across restarts and crashes.
func TestModelPrivacy(t *testing.T) {
	kr, err := keyring.Create(filepath.Join(t.TempDir(), "model.keyring"))
	require.NoError(t, err)
	modelKeyring = kr
	defer func() { modelKeyring = nil }()
	testkit.RunRapid(t, max(modelChecks()/4, 10), func(t *rapid.T) { modelPropWith(t, nil, true) })
	t.Logf("outcomes: %v", modelSeen)
}

// erasedNow reports whether scope's erasure is in force at now.
func (m *modelSM) erasedNow(scope string, now int64) bool {
	until, ok := m.erased[scope]
	return ok && now < until
}

// Erase erases one of the model's scopes: its records (and their tombstones) go; its keys
// are refused until Retention + TombstoneWindow after the erasure, or, erased again while
// in force, until the first erasure's end.
func (m *modelSM) Erase(t *rapid.T) {
	scope := rapid.SampledFrom(modelKeys).Draw(t, "eraseScopeOf").Scope
	now := m.tick()
	st, err := m.db.EraseScope(modelCtx, scope)
	require.NoError(t, err, "erase %s", scope)
	require.True(t, st.KeyDestroyed, "erase %s: the key file destroys the key", scope)
	visible := int64(0)
	for _, k := range modelKeys {
		if k.Scope == scope && m.visible(k, now) != nil {
			visible++
		}
	}
	if !m.erasedNow(scope, now) {
		m.erased[scope] = now + m.ret + max(m.window, 0)
		require.GreaterOrEqual(t, st.Records, visible, "erase %s: records counted", scope)
		modelSeen["erase"]++
	} else {
		modelSeen["erase-again"]++
	}
	require.Equal(t, m.erased[scope], st.Until.UnixNano(), "erase %s: until", scope)
	for _, k := range modelKeys {
		if k.Scope == scope {
			delete(m.recs, k)
			delete(m.ghosts, k)
		}
	}
	m.synced() // one synced batch
	for _, k := range modelKeys {
		if k.Scope == scope {
			m.lookup(t, k)
		}
	}
}
