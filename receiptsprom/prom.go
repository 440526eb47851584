// Package receiptsprom exports a receipts store's events and figures as
// Prometheus metrics. The core package does not import Prometheus: this
// package adapts observe.Observer.
//
//	c := receiptsprom.New(nil)
//	db, err := receipts.Open(dir, &receipts.Options{Observer: c})
//	...
//	c.Watch(db)                   // the store's gauges, read at scrape time
//	prometheus.MustRegister(c)    // or your own registry
//	http.Handle("/metrics", promhttp.Handler())
//
// Metrics (every one has the labels engine="pebble"|"postgres" and, where
// it applies, class: the caller's operation class, observe.WithOperationClass,
// "" if none; no label ever carries a key's scope or ID, a token, or any
// other unbounded value):
//
//	receipts_claims_total{engine,class,outcome}          counter: claims by outcome: claimed, took_over, replayed, in_progress, mismatch, expired, canceled, closed, error
//	receipts_finishes_total{engine,class,result}         counter: attempts ended: succeeded, failed, released, abandoned, lease_lost
//	receipts_operation_duration_seconds{engine,class,op} histogram: op=claim (a whole claim, waiting included), finish (the write that ends an attempt), attempt (claim to finish), gc
//	receipts_wait_duration_seconds{engine,class,result}  histogram: time a claim waited for another caller's attempt, by how the wait ended
//	receipts_leases_held{engine}                         gauge: leases handed out by this process and not finished yet
//	receipts_waiters{engine}                             gauge: claims waiting now (Watch)
//	receipts_abandoned_claims{engine}                    gauge: claims whose outcome is unknown, to reconcile (Watch; a scan, at most every Options.ScanEvery)
//	receipts_gc_runs_total{engine,result}                counter: GC runs, result ok or error
//	receipts_gc_epochs_dropped_total{engine}             counter: epochs (partitions) GC dropped
//	receipts_gc_bytes_freed_total{engine}                counter: bytes GC reclaimed (an estimate)
//	receipts_gc_last_run_timestamp_seconds{engine}       gauge: when GC last succeeded (Unix time): alert if it stops moving
//	receipts_<engine metric>{engine}                     the engine's own figures (Watch; receipts.DB.EngineMetrics): receipts_pebble_compaction_debt_bytes, receipts_pebble_wal_bytes, receipts_postgres_listener_reconnects_total, receipts_postgres_notify_flushes_total, ...
//
// The Collector is a observe.ReplayObserver: a Do answered at once with a
// stored receipt is counted by one call (ObserveReplay), with no events built.
//
// The class label multiplies every series by the number of classes: keep
// classes few and fixed (a dozen operation types, not one per customer).
package receiptsprom

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/driver"
	"github.com/receiptstore/receipts/observe"
)

// DefaultBuckets are the duration histograms' buckets, in seconds: from a
// replay from memory (50µs) to an export that holds its lease for minutes
// (observe.DurationBuckets, as receiptsotel's).
var DefaultBuckets = observe.DurationBuckets()

// DefaultScanEvery is how often, at most, a scrape recounts abandoned claims.
const DefaultScanEvery = time.Minute

// Options configure a Collector. A nil *Options means all defaults.
type Options struct {
	// Buckets for the duration histograms (seconds). Default DefaultBuckets.
	Buckets []float64
	// ConstLabels are added to every metric, e.g. {"store": "payments"}
	// when a process runs several stores.
	ConstLabels prometheus.Labels
	// ScanEvery bounds how often a scrape recounts the watched store's
	// abandoned claims (a scan of its records); in between, the last count
	// is reported. Zero means DefaultScanEvery; negative: never count, and
	// receipts_abandoned_claims is not exported.
	ScanEvery time.Duration
	// ScanTimeout bounds one count. Zero means 10s.
	ScanTimeout time.Duration
}

// Collector is a observe.Observer that counts events, and a
// prometheus.Collector that exports them with the watched stores' gauges.
// It is safe for concurrent use. One Collector may observe several stores
// (give each its own ConstLabels and Collector if they share an engine
// name and must be told apart).
type Collector struct {
	opts Options

	claims, finishes, gcRuns, gcDropped, gcFreed *prometheus.CounterVec
	leases, gcLast                               *prometheus.GaugeVec
	// The duration histograms are hists (striped, summed at scrape), not
	// prometheus.HistogramVecs: the series of each engine and class are in
	// cache, the GC's in gcDur.
	opDurDesc, waitDurDesc *prometheus.Desc
	// The documented outcomes' counters are ctrs (striped) too; the
	// CounterVecs claims and finishes hold only outcomes they do not list.
	claimsDesc, finishesDesc *prometheus.Desc
	upper                    []float64 // the buckets' upper bounds

	waitersDesc, abandonedDesc *prometheus.Desc

	cache sync.Map               // seriesKey -> *series
	last  atomic.Pointer[series] // the series looked up last: most stores have one engine and class

	mu      sync.Mutex
	watched []*watched // protected by mu
	engDesc map[string]*prometheus.Desc
	gcDur   map[string]*hist // engine -> op="gc" series; protected by mu
}

type watched struct {
	db     *receipts.DB
	engine string

	mu        sync.Mutex // serializes counts
	counted   time.Time
	abandoned float64
	countErr  error
}

// New returns a Collector. Register it (prometheus.MustRegister) and set
// it as the stores' Options.Observer.
func New(opts *Options) *Collector {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Buckets == nil {
		o.Buckets = DefaultBuckets
	}
	upper := bucketBounds(o.Buckets)
	if o.ScanEvery == 0 {
		o.ScanEvery = DefaultScanEvery
	}
	if o.ScanTimeout <= 0 {
		o.ScanTimeout = 10 * time.Second
	}
	cl := o.ConstLabels
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: cl}, labels)
	}
	const claimsHelp = "Claims by outcome (claimed, took_over, replayed, in_progress, mismatch, expired, canceled, closed, error)."
	const finishesHelp = "Attempts ended, by result (succeeded, failed, released, abandoned, lease_lost)."
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: cl}, labels)
	}
	return &Collector{
		opts:     o,
		claims:   counter("receipts_claims_total", claimsHelp, "engine", "class", "outcome"),
		finishes: counter("receipts_finishes_total", finishesHelp, "engine", "class", "result"),
		claimsDesc: prometheus.NewDesc("receipts_claims_total", claimsHelp,
			[]string{"engine", "class", "outcome"}, cl),
		finishesDesc: prometheus.NewDesc("receipts_finishes_total", finishesHelp,
			[]string{"engine", "class", "result"}, cl),
		gcRuns:    counter("receipts_gc_runs_total", "Garbage collections, by result (ok, error).", "engine", "result"),
		gcDropped: counter("receipts_gc_epochs_dropped_total", "Epochs (or partitions) garbage collection dropped.", "engine"),
		gcFreed:   counter("receipts_gc_bytes_freed_total", "Bytes garbage collection reclaimed (an estimate).", "engine"),
		opDurDesc: prometheus.NewDesc("receipts_operation_duration_seconds", "Duration of store operations: claim (waiting included), finish (the write that ends an attempt), attempt (claim to finish), gc.",
			[]string{"engine", "class", "op"}, cl),
		waitDurDesc: prometheus.NewDesc("receipts_wait_duration_seconds", "Time claims waited for another caller's attempt, by how the wait ended.",
			[]string{"engine", "class", "result"}, cl),
		upper:  upper,
		leases: gauge("receipts_leases_held", "Leases handed out by this process and not finished yet.", "engine"),
		gcLast: gauge("receipts_gc_last_run_timestamp_seconds", "When garbage collection last succeeded (Unix time).", "engine"),
		waitersDesc: prometheus.NewDesc("receipts_waiters", "Claims waiting now for another caller's attempt.",
			[]string{"engine"}, cl),
		abandonedDesc: prometheus.NewDesc("receipts_abandoned_claims", "Claims whose outcome is unknown (abandoned, or their lease ran out): outcomes to reconcile.",
			[]string{"engine"}, cl),
		engDesc: map[string]*prometheus.Desc{},
		gcDur:   map[string]*hist{},
	}
}

// bucketBounds are the upper bounds of buckets as prometheus.NewHistogram
// takes them: DefBuckets if there are none, a last +Inf dropped (it is
// implicit), and a panic unless they increase.
func bucketBounds(buckets []float64) []float64 {
	if len(buckets) == 0 {
		buckets = prometheus.DefBuckets
	}
	if math.IsInf(buckets[len(buckets)-1], +1) {
		buckets = buckets[:len(buckets)-1]
	}
	for i := 1; i < len(buckets); i++ {
		if buckets[i] <= buckets[i-1] {
			panic(fmt.Sprintf("receiptsprom: histogram buckets must be in increasing order: %v >= %v", buckets[i-1], buckets[i]))
		}
	}
	return slices.Clone(buckets)
}

// series are the children of the vectors for one engine and class, looked
// up once: an event then costs an array index and an atomic add, not a
// hash of its labels.
type series struct {
	k                               seriesKey
	claimDur, finishDur, attemptDur *hist
	leases                          prometheus.Gauge
	// claims and finishes hold every documented outcome from the start
	// (series at zero, as Prometheus advises): read-only after. A short
	// slice searched in order (the common outcomes first) is cheaper than
	// a map lookup, which hashes the outcome.
	claims, finishes []outcomeCounter
	mu               sync.Mutex                // guards waits
	waits            map[observe.Outcome]*hist // filled as waits end (rare)
}

var (
	claimOutcomes = []observe.Outcome{observe.OutcomeReplayed, observe.OutcomeClaimed, observe.OutcomeTookOver,
		observe.OutcomeInProgress, observe.OutcomeMismatch, observe.OutcomeExpired, observe.OutcomeCanceled, observe.OutcomeClosed, observe.OutcomeError}
	finishOutcomes = []observe.Outcome{observe.OutcomeSucceeded, observe.OutcomeFailed, observe.OutcomeReleased,
		observe.OutcomeAbandoned, observe.OutcomeLeaseLost}
)

type seriesKey struct{ engine, class string }

// outcomeCounter is the counter of one outcome.
type outcomeCounter struct {
	out observe.Outcome
	ctr *ctr
}

func (c *Collector) series(engine, class string) *series {
	k := seriesKey{engine, class}
	if s := c.last.Load(); s != nil && s.k == k {
		return s
	}
	if s, ok := c.cache.Load(k); ok {
		c.last.Store(s.(*series))
		return s.(*series)
	}
	s := &series{
		k:          k,
		claimDur:   newHist(c.opDurDesc, c.upper, engine, class, "claim"),
		finishDur:  newHist(c.opDurDesc, c.upper, engine, class, "finish"),
		attemptDur: newHist(c.opDurDesc, c.upper, engine, class, "attempt"),
		leases:     c.leases.WithLabelValues(engine),
		waits:      map[observe.Outcome]*hist{},
	}
	for _, o := range claimOutcomes {
		s.claims = append(s.claims, outcomeCounter{o, newCtr(c.claimsDesc, engine, class, string(o))})
	}
	for _, o := range finishOutcomes {
		s.finishes = append(s.finishes, outcomeCounter{o, newCtr(c.finishesDesc, engine, class, string(o))})
	}
	got, _ := c.cache.LoadOrStore(k, s)
	c.last.Store(got.(*series))
	return got.(*series)
}

// inc counts out: in m, or (an outcome this version does not list) in
// vec's child for it.
func (s *series) inc(sh int, m []outcomeCounter, vec *prometheus.CounterVec, k seriesKey, out observe.Outcome) {
	for _, oc := range m {
		if oc.out == out {
			oc.ctr.inc(sh)
			return
		}
	}
	vec.WithLabelValues(k.engine, k.class, string(out)).Inc()
}

func (s *series) wait(c *Collector, out observe.Outcome) *hist {
	s.mu.Lock()
	defer s.mu.Unlock()
	h, ok := s.waits[out]
	if !ok {
		h = newHist(c.waitDurDesc, c.upper, s.k.engine, s.k.class, string(out))
		s.waits[out] = h
	}
	return h
}

// metrics sends s's histograms.
func (s *series) metrics(ch chan<- prometheus.Metric) {
	for _, oc := range s.claims {
		ch <- oc.ctr.metric()
	}
	for _, oc := range s.finishes {
		ch <- oc.ctr.metric()
	}
	ch <- s.claimDur.metric()
	ch <- s.finishDur.metric()
	ch <- s.attemptDur.metric()
	s.mu.Lock()
	ws := slices.Collect(maps.Values(s.waits))
	s.mu.Unlock()
	for _, h := range ws {
		ch <- h.metric()
	}
}

// gcHist is the op="gc" series of engine.
func (c *Collector) gcHist(engine string) *hist {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.gcDur[engine]
	if !ok {
		h = newHist(c.opDurDesc, c.upper, engine, "", "gc")
		c.gcDur[engine] = h
	}
	return h
}

// ObservesKind declines DoEvents (observe.KindFilter): a Do's claim and
// finish events already carry what the metrics count.
func (c *Collector) ObservesKind(kind observe.EventKind) bool { return kind != observe.DoEvent }

// Observe counts e (observe.Observer).
func (c *Collector) Observe(_ context.Context, e observe.Event) { c.observe(&e) }

// ObserveReplay counts a Do's replay answered at once, as Observe counts its ClaimEvent
// (observe.ReplayObserver): the store then builds no events for it.
func (c *Collector) ObserveReplay(_ context.Context, e observe.Event) { c.observe(&e) }

// BeginAt returns ctx (observe.ReplayObserver): the Collector starts nothing.
func (c *Collector) BeginAt(ctx context.Context, _ observe.EventKind, _ time.Time) context.Context {
	return ctx
}

var _ observe.ReplayObserver = (*Collector)(nil)

func (c *Collector) observe(e *observe.Event) {
	k := seriesKey{e.Engine, e.Class}
	switch e.Kind {
	case observe.ClaimEvent:
		s := c.series(e.Engine, e.Class)
		sh := stripe()
		s.inc(sh, s.claims, c.claims, k, e.Outcome)
		s.claimDur.observe(sh, e.Duration.Seconds())
		if e.Outcome == observe.OutcomeClaimed || e.Outcome == observe.OutcomeTookOver {
			s.leases.Inc()
		}
	case observe.WaitEvent:
		s := c.series(e.Engine, e.Class)
		s.wait(c, e.Outcome).observe(stripe(), e.Duration.Seconds())
	case observe.FinishEvent:
		s := c.series(e.Engine, e.Class)
		sh := stripe()
		s.inc(sh, s.finishes, c.finishes, k, e.Outcome)
		s.finishDur.observe(sh, e.Duration.Seconds())
		s.attemptDur.observe(sh, e.Held.Seconds())
		s.leases.Dec()
	case observe.GCEvent:
		c.gcRuns.WithLabelValues(e.Engine, string(e.Outcome)).Inc()
		c.gcHist(e.Engine).observe(stripe(), e.Duration.Seconds())
		if e.Outcome == observe.OutcomeOK {
			c.gcDropped.WithLabelValues(e.Engine).Add(float64(e.EpochsDropped))
			c.gcFreed.WithLabelValues(e.Engine).Add(float64(e.BytesFreed))
			c.gcLast.WithLabelValues(e.Engine).Set(float64(e.Start.Add(e.Duration).UnixNano()) / 1e9)
		}
	}
}

// Watch adds db's gauges to the scrape: its waiters, its abandoned claims
// (counted at most every Options.ScanEvery) and its engine's own figures
// (receipts.DB.EngineMetrics). Once db is closed it is dropped from the
// scrape. Watch a store from one Collector only.
func (c *Collector) Watch(db *receipts.DB) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.watched = append(c.watched, &watched{db: db, engine: db.Driver().Name()})
}

// Describe sends nothing (prometheus.Collector): the engines' own figures
// are known only once a store is watched, so the Collector is unchecked,
// and the registry checks what it collects at each scrape instead.
func (c *Collector) Describe(chan<- *prometheus.Desc) {}

func (c *Collector) vecs() []prometheus.Collector {
	return []prometheus.Collector{c.claims, c.finishes, c.gcRuns, c.gcDropped, c.gcFreed, c.leases, c.gcLast}
}

// Collect sends the metrics (prometheus.Collector).
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.vecs() {
		m.Collect(ch)
	}
	c.cache.Range(func(_, s any) bool {
		s.(*series).metrics(ch)
		return true
	})
	c.mu.Lock()
	ws := append([]*watched(nil), c.watched...)
	gcs := slices.Collect(maps.Values(c.gcDur))
	c.mu.Unlock()
	for _, h := range gcs {
		ch <- h.metric()
	}
	for _, w := range ws {
		ms := w.db.EngineMetrics() // nil once closed
		if ms == nil && c.closed(w) {
			continue
		}
		st := w.db.Stats()
		ch <- prometheus.MustNewConstMetric(c.waitersDesc, prometheus.GaugeValue, float64(st.Waiters), w.engine)
		if c.opts.ScanEvery > 0 {
			if n, ok := c.abandoned(w); ok {
				ch <- prometheus.MustNewConstMetric(c.abandonedDesc, prometheus.GaugeValue, n, w.engine)
			}
		}
		for _, m := range ms {
			ch <- prometheus.MustNewConstMetric(c.engineDesc(m), valueType(m), m.Value, w.engine)
		}
	}
}

// closed reports whether w's store is closed, and if so stops watching it.
func (c *Collector) closed(w *watched) bool {
	if _, err := w.db.GC(canceled); !errors.Is(err, receipts.ErrClosed) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range c.watched {
		if x == w {
			c.watched = append(c.watched[:i], c.watched[i+1:]...)
			break
		}
	}
	return true
}

// canceled is a context that has ended: DB.GC with it only checks that the
// store is open.
var canceled = func() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}()

// abandoned returns w's count of abandoned claims, recounted if the last
// count is older than ScanEvery; ok is false if no count succeeded yet.
func (c *Collector) abandoned(w *watched) (float64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.counted.IsZero() || time.Since(w.counted) >= c.opts.ScanEvery {
		ctx, cancel := context.WithTimeout(context.Background(), c.opts.ScanTimeout)
		defer cancel()
		n := 0
		var err error
		for _, serr := range w.db.Scan(ctx, receipts.Filter{Abandoned: true}) {
			if serr != nil {
				err = serr
				break
			}
			n++
		}
		w.countErr = err
		if err == nil {
			w.abandoned, w.counted = float64(n), time.Now()
		}
	}
	return w.abandoned, !w.counted.IsZero()
}

func (c *Collector) engineDesc(m driver.Metric) *prometheus.Desc {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.engDesc[m.Name]
	if !ok {
		d = prometheus.NewDesc("receipts_"+m.Name, m.Help, []string{"engine"}, c.opts.ConstLabels)
		c.engDesc[m.Name] = d
	}
	return d
}

func valueType(m driver.Metric) prometheus.ValueType {
	if m.Counter {
		return prometheus.CounterValue
	}
	return prometheus.GaugeValue
}
