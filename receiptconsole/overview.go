package receiptconsole

import (
	"net/http"
	"strconv"
	"time"

	"github.com/receiptstore/receipts"
)

// The Overview page: the store as its metrics read it.

type overviewData struct {
	Engine       string
	Durability   []metricRow // the engine's durability figures
	Metrics      []metricRow // every figure of the engine
	Counts       receipts.Counts
	CountErr     string
	Live         int64 // pending with a live lease
	Oldest       *keyRow
	PendingErr   string
	Stats        receipts.Stats
	Tombstone    time.Duration
	ErasuresIn   int
	ErasuresAll  int
	ErasuresErr  string
	PebbleEngine bool
	Journal      bool // the console has the host half's journal
	Uncertain    int  // its uncertain actions
	JournalErr   string
}

type metricRow struct {
	Name, Help, Value string
	Warn              bool
}

// durabilityWarn says which durability figures read as a problem when 0 (or, for
// commits_unconfirmed, when not 0).
var durabilityWarn = map[string]func(float64) bool{
	"postgres_sync_standby_up":           func(v float64) bool { return v == 0 },
	"postgres_sync_standby_configured":   func(v float64) bool { return v == 0 },
	"postgres_synchronous_commit":        func(v float64) bool { return v < 3 },
	"postgres_primary":                   func(v float64) bool { return v == 0 },
	"postgres_replication_visible":       func(v float64) bool { return v == 0 },
	"postgres_commit_check":              func(v float64) bool { return v == 0 },
	"postgres_require_sync_standby":      func(v float64) bool { return false },
	"postgres_commits_unconfirmed_total": func(v float64) bool { return v != 0 },
}

func (c *console) overview(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	now := c.now(ctx)
	d := overviewData{Engine: c.db.Driver().Name(), Stats: c.db.Stats(), Tombstone: c.db.Options().TombstoneWindow}
	d.PebbleEngine = d.Engine == "pebble"
	for _, m := range c.db.EngineMetrics() {
		row := metricRow{Name: "receipts_" + m.Name, Help: m.Help, Value: strconv.FormatFloat(m.Value, 'f', -1, 64)}
		if warn, ok := durabilityWarn[m.Name]; ok {
			row.Warn = warn(m.Value)
			d.Durability = append(d.Durability, row)
		}
		d.Metrics = append(d.Metrics, row)
	}
	if cnt, err := c.db.Count(ctx); err != nil {
		d.CountErr = err.Error()
	} else {
		d.Counts = cnt
		d.Live = cnt.Pending - cnt.Abandoned
	}
	for rec, err := range c.db.Scan(ctx, receipts.Filter{State: receipts.Pending}) {
		if err != nil {
			d.PendingErr = err.Error()
			if ctx.Err() != nil {
				break
			}
			continue
		}
		if d.Oldest == nil || rec.CreatedAt.Before(d.Oldest.CreatedAt) {
			row := c.keyRow(rec, now)
			d.Oldest = &row
		}
	}
	for st, err := range c.db.Erasures(ctx) {
		if err != nil {
			d.ErasuresErr = err.Error()
			break
		}
		d.ErasuresAll++
		if now.Before(st.Until) {
			d.ErasuresIn++
		}
	}
	if j := c.opts.Journal; j != nil {
		d.Journal = true
		for _, err := range j.Actions(ctx, "uncertain") {
			if err != nil {
				d.JournalErr = err.Error()
				break
			}
			d.Uncertain++
		}
	}
	c.render(w, r, http.StatusOK, "overview", view{Title: "Overview", Nav: "overview", Now: now, Data: d})
}
