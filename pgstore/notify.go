package pgstore

import (
	"context"
	"encoding/hex"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/receiptstore/receipts/driver"
)

// Wake-ups (PGSTORE §6). Hints only: a woken waiter re-reads.
//
//   - In process: a write that returns wakes the key's local watchers at once.
//   - Across nodes: the write queues the key's hash; the notifier sends what has queued at
//     most once per NotifyInterval in one transaction of its own (pg_notify, several hashes per payload),
//     never inside a claim or commit transaction (a notifying commit takes a cluster-wide lock
//     across its flush). Payloads hold key hashes only: anyone in the database may LISTEN.
//   - finishTx commits in the caller's transaction, which the engine does not see commit: it
//     queues the transaction id, and the notifier asks pg_xact_status until it has committed
//     (then wakes as above) or aborted (then drops it).
//   - The listener holds one dedicated session (ListenConn) and wakes the watchers of every
//     hash it hears. On (re)connect it LISTENs first and then wakes every local watcher, so a
//     commit made while it was away is not missed.
//   - Poll-only mode (no ListenConn, e.g. behind PgBouncer in transaction mode, where LISTEN
//     does not work), and while the listener is down: every PollInterval all local watchers
//     are woken to re-read.

// hub holds this engine's watchers.
type hub struct {
	mu sync.Mutex
	w  map[[16]byte]map[chan struct{}]struct{}
	n  int
}

func (h *hub) init() { h.w = make(map[[16]byte]map[chan struct{}]struct{}) }

func (h *hub) watch(k [16]byte) (<-chan struct{}, func()) {
	c := make(chan struct{}, 1)
	h.mu.Lock()
	m := h.w[k]
	if m == nil {
		m = make(map[chan struct{}]struct{})
		h.w[k] = m
	}
	m[c] = struct{}{}
	h.n++
	h.mu.Unlock()
	var once sync.Once
	return c, func() {
		once.Do(func() {
			h.mu.Lock()
			delete(m, c)
			if cur, ok := h.w[k]; ok && len(cur) == 0 {
				delete(h.w, k)
			}
			h.n--
			h.mu.Unlock()
		})
	}
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

func (h *hub) wake(k [16]byte) {
	h.mu.Lock()
	for c := range h.w[k] {
		signal(c)
	}
	h.mu.Unlock()
}

func (h *hub) wakeAll() {
	h.mu.Lock()
	for _, m := range h.w {
		for c := range m {
			signal(c)
		}
	}
	h.mu.Unlock()
}

func (h *hub) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}

// Watch implements driver.Engine.
func (e *engine) Watch(k driver.Key) (<-chan struct{}, func()) { return e.hub.watch(keyHash(k)) }

// wake is called after a write of k has committed.
func (e *engine) wake(k driver.Key) {
	h := keyHash(k)
	e.hub.wake(h)
	e.notifier.queue(h)
}

// wakeFinished is wake for a write that finished k with rec: a retry of k is now probably a
// replay (the hint, with rec's epoch), and the key's hash is computed once for both.
func (e *engine) wakeFinished(k driver.Key, rec driver.Record) {
	h := keyHash(k)
	e.hub.wake(h)
	e.notifier.queue(h)
	e.hint.add(h, e.epochOf(rec.UpdatedAt))
}

// maxPayload bounds one NOTIFY payload (the server's limit is 8000 bytes).
const maxPayload = 7800

// maxPendingTx bounds the transactions finishTx left to watch (beyond it the oldest are
// dropped: waiters fall back to their re-check period).
const maxPendingTx = 10000

type pendingTx struct {
	xid string
	key [16]byte
}

// notifier coalesces wake-ups for other nodes.
type notifier struct {
	e    *engine
	mu   sync.Mutex
	keys map[[16]byte]struct{}
	txs  []pendingTx
	kick chan struct{}
}

func (n *notifier) init(e *engine) {
	n.e = e
	n.keys = make(map[[16]byte]struct{})
	n.kick = make(chan struct{}, 1)
}

func (n *notifier) queue(h [16]byte) {
	if n.e.o.NotifyInterval < 0 {
		return
	}
	n.mu.Lock()
	n.keys[h] = struct{}{}
	n.mu.Unlock()
	signal(n.kick)
}

func (n *notifier) afterCommit(xid string, h [16]byte) {
	if xid == "" {
		return
	}
	n.mu.Lock()
	if len(n.txs) >= maxPendingTx {
		n.txs = n.txs[1:]
	}
	n.txs = append(n.txs, pendingTx{xid, h})
	n.mu.Unlock()
	signal(n.kick)
}

// run flushes at most once per NotifyInterval, only when something is queued: a wake-up
// after a quiet interval goes out at once, the ones that follow within the interval wait
// for the next flush and share it.
func (n *notifier) run() {
	defer n.e.wg.Done()
	ctx := n.e.ctx
	interval := max(n.e.o.NotifyInterval, time.Millisecond)
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.kick:
		}
		if wait := time.Until(last.Add(interval)); wait > 0 {
			if sleep(ctx, wait) != nil {
				return
			}
		}
		last = time.Now()
		n.checkTxs(ctx)
		n.flush(ctx)
	}
}

// checkTxs resolves the transactions finishTx wrote in: committed ones wake their keys.
func (n *notifier) checkTxs(ctx context.Context) {
	n.mu.Lock()
	txs := n.txs
	n.txs = nil
	n.mu.Unlock()
	if len(txs) == 0 {
		return
	}
	xids := make([]string, len(txs))
	for i, t := range txs {
		xids[i] = t.xid
	}
	rows, err := n.e.pool.Query(ctx, `SELECT x, coalesce(pg_xact_status(x::xid8), 'gone') FROM unnest($1::text[]) AS x`, xids)
	status := make(map[string]string, len(txs))
	if err == nil {
		for rows.Next() {
			var x, s string
			if err = rows.Scan(&x, &s); err != nil {
				break
			}
			status[x] = s
		}
		rows.Close()
		if err == nil {
			err = rows.Err()
		}
	}
	var keep []pendingTx
	for _, t := range txs {
		switch status[t.xid] {
		case "committed":
			n.e.hub.wake(t.key)
			n.queue(t.key)
		case "in progress", "":
			keep = append(keep, t)
		}
	}
	if err != nil && ctx.Err() == nil {
		n.e.o.Logger.Warn("pgstore: checking transactions for wake-ups", "err", err)
	}
	if len(keep) > 0 {
		n.mu.Lock()
		n.txs = append(keep, n.txs...)
		n.mu.Unlock()
		signal(n.kick)
	}
}

// flush sends the queued hashes: one statement, one transaction, several hashes per payload.
func (n *notifier) flush(ctx context.Context) {
	n.mu.Lock()
	keys := n.keys
	if len(keys) == 0 {
		n.mu.Unlock()
		return
	}
	n.keys = make(map[[16]byte]struct{})
	n.mu.Unlock()
	var payloads []string
	var b strings.Builder
	for h := range keys {
		if b.Len()+33 > maxPayload {
			payloads = append(payloads, b.String())
			b.Reset()
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(hex.EncodeToString(h[:]))
	}
	payloads = append(payloads, b.String())
	n.e.flushes.Add(1)
	if _, err := n.e.pool.Exec(ctx, `SELECT pg_notify($1, p) FROM unnest($2::text[]) AS p`, n.e.q.channel, payloads); err != nil && ctx.Err() == nil {
		n.e.flushErrors.Add(1)
		n.e.o.Logger.Warn("pgstore: notify", "err", err)
	}
}

// listen keeps one LISTEN session open and wakes local watchers from what it hears.
func (e *engine) listen() {
	defer e.wg.Done()
	ctx := e.ctx
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		err := e.listenOnce(ctx)
		e.listenUp.Store(false)
		e.hub.wakeAll()
		if ctx.Err() != nil {
			return
		}
		e.o.Logger.Warn("pgstore: listener down; polling until it is back", "err", err)
		if sleep(ctx, backoff) != nil {
			return
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (e *engine) listenOnce(ctx context.Context) error {
	conn, err := e.o.ListenConn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{e.q.channel}.Sanitize()); err != nil {
		return err
	}
	e.listenUp.Store(true)
	e.listens.Add(1)
	e.hub.wakeAll() // anything committed before LISTEN took effect: re-read
	for {
		nt, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		for _, p := range strings.Split(nt.Payload, ",") {
			var h [16]byte
			if b, err := hex.DecodeString(p); err == nil && len(b) == len(h) {
				copy(h[:], b)
				e.hub.wake(h)
			}
		}
	}
}

// poll wakes every local watcher each PollInterval while no LISTEN session is up.
func (e *engine) poll() {
	defer e.wg.Done()
	t := time.NewTicker(e.o.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
			if !e.listenUp.Load() && e.hub.count() > 0 {
				e.hub.wakeAll()
			}
		}
	}
}
