package receiptsprom_test

// The files in ../monitoring are written from the rules and panels below
// (`go test ./receiptsprom -run TestMonitoring -update`), and checked here:
// every expression names only metrics and labels receiptsprom exports, as
// gathered from a Pebble and a PostgreSQL store under a small workload, and
// parses (promtool check rules, when promtool is installed: Debian's
// prometheus package; CI installs it). The Go PromQL parser is in
// github.com/prometheus/prometheus, a module with hundreds of requirements:
// not worth a test's dependency when promtool checks the same.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/internal/pgtest"
	"github.com/receiptstore/receipts/observe"
	"github.com/receiptstore/receipts/receiptsprom"
	"github.com/receiptstore/receipts/receiptstest"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "write ../monitoring's files from the rules and panels in monitoring_test.go")

const runbookBase = "https://github.com/receiptstore/receipts/blob/main/monitoring/README.md#"

// alert is one alerting rule with its promtool unit test: series that
// make it fire at fireAt (and not at quietAt) with the labels want.
type alert struct {
	name, expr, forDur, severity, summary, description string
	series                                             []series
	quietAt, fireAt                                    string
	want                                               map[string]string
	wantSummary                                        string // the summary rendered at fireAt
}

type series struct{ name, values string }

var alerts = []alert{
	{
		name:        "ReceiptsAbandonedClaimsGrowing",
		expr:        `receipts_abandoned_claims > 0 and delta(receipts_abandoned_claims[1h]) > 0`,
		forDur:      "15m",
		severity:    "warning",
		summary:     "Abandoned claims are growing on {{ $labels.engine }} ({{ $value }} now)",
		description: "Claims whose outcome is unknown keep accumulating: holders crash or their effects fail uncertainly, and nothing reconciles them.",
		series:      []series{{`receipts_abandoned_claims{engine="pebble",instance="svc-1"}`, "0 0 0 0 0 0 0 0 0 0 0+1x80"}},
		quietAt:     "9m", fireAt: "40m",
		want:        map[string]string{"engine": "pebble", "instance": "svc-1"},
		wantSummary: "Abandoned claims are growing on pebble (30 now)",
	},
	{
		name:        "ReceiptsGCStalled",
		expr:        `time() - receipts_gc_last_run_timestamp_seconds > 3 * 3600`,
		forDur:      "15m",
		severity:    "warning",
		summary:     "No successful garbage collection on {{ $labels.engine }} for {{ $value | humanizeDuration }}",
		description: "Retention is not being reclaimed, and the disk (or the PostgreSQL partitions) grows.",
		series:      []series{{`receipts_gc_last_run_timestamp_seconds{engine="postgres",instance="svc-1"}`, "0x300"}},
		quietAt:     "2h", fireAt: "4h",
		want:        map[string]string{"engine": "postgres", "instance": "svc-1"},
		wantSummary: "No successful garbage collection on postgres for 4h 0m 0s",
	},
	{
		name: "ReceiptsLeasesLost",
		expr: `sum by (engine, class) (rate(receipts_finishes_total{result="lease_lost"}[15m]))
  / sum by (engine, class) (rate(receipts_finishes_total[15m])) > 0.01`,
		forDur:      "15m",
		severity:    "warning",
		summary:     "{{ $value | humanizePercentage }} of {{ $labels.class }} attempts on {{ $labels.engine }} lost their lease",
		description: "Effects outlast their lease, or nodes die mid-effect: another caller may take the key over while the first still runs.",
		series: []series{
			{`receipts_finishes_total{engine="pebble",class="export",result="succeeded",instance="svc-1"}`, "0+100x60"},
			{`receipts_finishes_total{engine="pebble",class="export",result="lease_lost",instance="svc-1"}`, "0x10 0+5x50"},
		},
		quietAt: "10m", fireAt: "45m",
		want:        map[string]string{"engine": "pebble", "class": "export"},
		wantSummary: "4.762% of export attempts on pebble lost their lease",
	},
	{
		name: "ReceiptsWaitTimeTail",
		expr: `histogram_quantile(0.99,
  sum by (engine, class, le) (rate(receipts_wait_duration_seconds_bucket[10m]))) > 5`,
		forDur:      "15m",
		severity:    "warning",
		summary:     "p99 wait for in-flight {{ $labels.class }} calls on {{ $labels.engine }} is {{ $value | humanizeDuration }}",
		description: "Duplicates wait long for the first call's outcome: slow effects, or clients retrying long before the first call ends.",
		series: []series{
			{`receipts_wait_duration_seconds_bucket{engine="pebble",class="refund",result="ok",le="1"}`, "0+10x10 0+0x50"},
			{`receipts_wait_duration_seconds_bucket{engine="pebble",class="refund",result="ok",le="10"}`, "0+10x60"},
			{`receipts_wait_duration_seconds_bucket{engine="pebble",class="refund",result="ok",le="+Inf"}`, "0+10x60"},
		},
		quietAt: "10m", fireAt: "45m",
		want:        map[string]string{"engine": "pebble", "class": "refund"},
		wantSummary: "p99 wait for in-flight refund calls on pebble is 9.91s",
	},
	{
		name:        "ReceiptsPostgresListenerDown",
		expr:        `receipts_postgres_listener_up == 0`,
		forDur:      "5m",
		severity:    "warning",
		summary:     "The LISTEN session of {{ $labels.instance }} is down",
		description: "Waiters on this node poll every PollInterval instead of waking on NOTIFY: duplicates wait longer.",
		series:      []series{{`receipts_postgres_listener_up{engine="postgres",instance="svc-2"}`, "1x10 0x30"}},
		quietAt:     "12m", fireAt: "20m",
		want:        map[string]string{"engine": "postgres", "instance": "svc-2"},
		wantSummary: "The LISTEN session of svc-2 is down",
	},
	{
		name: "ReceiptsBatchFailures",
		expr: `sum by (engine, instance) (rate(receipts_postgres_batch_failures_total[15m]))
  / sum by (engine, instance) (rate(receipts_postgres_batches_total[15m])) > 0.05`,
		forDur:      "15m",
		severity:    "warning",
		summary:     "{{ $value | humanizePercentage }} of PostgreSQL batches fail on {{ $labels.instance }}",
		description: "Batched statements fail (server errors, lost replies) and their calls go on one by one: more load on a server that is already in trouble.",
		series: []series{
			{`receipts_postgres_batches_total{engine="postgres",instance="svc-2"}`, "0+100x60"},
			{`receipts_postgres_batch_failures_total{engine="postgres",instance="svc-2"}`, "0x10 0+10x50"},
		},
		quietAt: "10m", fireAt: "45m",
		want:        map[string]string{"engine": "postgres", "instance": "svc-2"},
		wantSummary: "10% of PostgreSQL batches fail on svc-2",
	},
}

// panel is one dashboard panel: a title, a unit and its queries (legend
// format, expression).
type panel struct {
	title, unit, description string
	targets                  [][2]string
}

var panels = []panel{
	{"Calls by outcome", "reqps", "Every claim, by engine, operation class and outcome.",
		[][2]string{{"{{engine}} {{class}} {{outcome}}", `sum by (engine, class, outcome) (rate(receipts_claims_total[5m]))`}}},
	{"Throughput: attempts started", "reqps", "First calls and takeovers: the effects that run.",
		[][2]string{{"{{engine}} {{class}}", `sum by (engine, class) (rate(receipts_claims_total{outcome=~"claimed|took_over"}[5m]))`}}},
	{"Replay rate", "percentunit", "Share of calls answered from a stored receipt: the retries absorbed.",
		[][2]string{{"{{engine}} {{class}}", `sum by (engine, class) (rate(receipts_claims_total{outcome="replayed"}[5m])) / sum by (engine, class) (rate(receipts_claims_total[5m]))`}}},
	{"Conflict rate", "reqps", "Duplicates while the first call runs (in_progress), keys reused with other arguments (mismatch: a client bug), late retries a tombstone stopped (expired).",
		[][2]string{{"{{engine}} {{class}} {{outcome}}", `sum by (engine, class, outcome) (rate(receipts_claims_total{outcome=~"in_progress|mismatch|expired"}[5m]))`}}},
	{"Attempt duration (claim to outcome)", "s", "p50 and p99 by operation class: what RetryAfter is estimated from.",
		[][2]string{
			{"p50 {{engine}} {{class}}", `histogram_quantile(0.5, sum by (engine, class, le) (rate(receipts_operation_duration_seconds_bucket{op="attempt"}[5m])))`},
			{"p99 {{engine}} {{class}}", `histogram_quantile(0.99, sum by (engine, class, le) (rate(receipts_operation_duration_seconds_bucket{op="attempt"}[5m])))`},
		}},
	{"Abandoned claims", "short", "Outcomes to reconcile (alert: ReceiptsAbandonedClaimsGrowing).",
		[][2]string{{"{{engine}} {{instance}}", `receipts_abandoned_claims`}}},
	{"Time since the last successful GC", "s", "Alert: ReceiptsGCStalled. Failed runs are counted by result.",
		[][2]string{
			{"{{engine}} {{instance}}", `time() - receipts_gc_last_run_timestamp_seconds`},
			{"failed runs/s {{engine}}", `sum by (engine) (rate(receipts_gc_runs_total{result="error"}[1h]))`},
		}},
	{"Lease-lost rate", "percentunit", "Share of attempts that lost their lease (alert: ReceiptsLeasesLost).",
		[][2]string{{"{{engine}} {{class}}", `sum by (engine, class) (rate(receipts_finishes_total{result="lease_lost"}[15m])) / sum by (engine, class) (rate(receipts_finishes_total[15m]))`}}},
	{"Wait time p99", "s", "How long duplicates wait for the first call (alert: ReceiptsWaitTimeTail).",
		[][2]string{{"{{engine}} {{class}}", `histogram_quantile(0.99, sum by (engine, class, le) (rate(receipts_wait_duration_seconds_bucket[10m])))`}}},
	{"In flight", "short", "Leases held and claims waiting, per process.",
		[][2]string{
			{"leases {{engine}} {{instance}}", `receipts_leases_held`},
			{"waiters {{engine}} {{instance}}", `receipts_waiters`},
		}},
	{"PostgreSQL LISTEN session", "short", "1 while up; 0 while waiters poll (alert: ReceiptsPostgresListenerDown).",
		[][2]string{{"{{instance}}", `receipts_postgres_listener_up`}}},
	{"PostgreSQL batches", "short", "Mean calls per batch, and the share of batches that failed (alert: ReceiptsBatchFailures).",
		[][2]string{
			{"calls per batch {{instance}}", `sum by (engine, instance) (rate(receipts_postgres_batched_calls_total[5m])) / sum by (engine, instance) (rate(receipts_postgres_batches_total[5m]))`},
			{"failed share {{instance}}", `sum by (engine, instance) (rate(receipts_postgres_batch_failures_total[15m])) / sum by (engine, instance) (rate(receipts_postgres_batches_total[15m]))`},
		}},
}

func TestMonitoring(t *testing.T) {
	files := map[string]string{
		"alerts.yml":      alertRules(),
		"alerts_test.yml": alertTests(),
		"dashboard.json":  dashboard(t),
	}
	for name, want := range files {
		path := filepath.Join("..", "monitoring", name)
		if *update {
			require.NoError(t, os.WriteFile(path, []byte(want), 0o644))
			continue
		}
		got, err := os.ReadFile(path)
		require.NoError(t, err)
		if string(got) != want {
			t.Errorf("%s differs from what monitoring_test.go writes: run go test ./receiptsprom -run TestMonitoring -update", path)
		}
	}

	// Every alert has its runbook paragraph.
	readme, err := os.ReadFile(filepath.Join("..", "monitoring", "README.md"))
	require.NoError(t, err)
	for _, a := range alerts {
		require.Contains(t, string(readme), "\n### "+a.name+"\n", "monitoring/README.md has no runbook for %s", a.name)
	}

	// Every expression names exported metrics and labels only.
	names, labels := exported(t)
	var exprs []string
	for _, a := range alerts {
		exprs = append(exprs, a.expr)
	}
	for _, p := range panels {
		for _, tg := range p.targets {
			exprs = append(exprs, tg[1])
		}
	}
	for _, e := range exprs {
		for _, m := range metricName.FindAllString(e, -1) {
			if !names[m] {
				t.Errorf("%q names %s, which receiptsprom does not export (it exports %v)", e, m, sortedKeys(names))
			}
		}
		for _, l := range labelsIn(e) {
			if !labels[l] {
				t.Errorf("%q uses label %q, which no exported metric has (%v)", e, l, sortedKeys(labels))
			}
		}
	}

	// Every expression parses, and every alert fires on its synthetic series.
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not installed (Debian: apt-get install prometheus); CI checks the rules with it")
		}
		t.Skip("promtool is not installed (Debian: apt-get install prometheus): expressions not parsed")
	}
	dir := t.TempDir()
	var rec strings.Builder
	rec.WriteString("groups:\n  - name: dashboard-expressions\n    rules:\n")
	for i, e := range exprs {
		fmt.Fprintf(&rec, "      - record: check:expr_%d\n        expr: %s\n", i, quote(e))
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "exprs.yml"), []byte(rec.String()), 0o644))
	for _, args := range [][]string{
		{"check", "rules", filepath.Join("..", "monitoring", "alerts.yml")},
		{"check", "rules", filepath.Join(dir, "exprs.yml")},
		{"test", "rules", filepath.Join("..", "monitoring", "alerts_test.yml")},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

var (
	metricName = regexp.MustCompile(`\breceipts_[a-z0-9_]+\b`)
	byClause   = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
	matcher    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"`)
)

// labelsIn returns the label names e groups by or matches on.
func labelsIn(e string) []string {
	var out []string
	for _, m := range byClause.FindAllStringSubmatch(e, -1) {
		for _, l := range strings.Split(m[1], ",") {
			out = append(out, strings.TrimSpace(l))
		}
	}
	for _, m := range matcher.FindAllStringSubmatch(e, -1) {
		out = append(out, m[1])
	}
	return out
}

// exported returns the metric names (histograms with their _bucket, _sum
// and _count series) and label names a Pebble store and a PostgreSQL store
// report through one Collector after a small workload: calls, a replay, a
// wait, an abandoned attempt and a GC.
func exported(t *testing.T) (names, labels map[string]bool) {
	c := receiptsprom.New(&receiptsprom.Options{ScanEvery: time.Nanosecond})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	work := func(db *receipts.DB) {
		c.Watch(db)
		ctx := observe.WithOperationClass(bg, "check")
		_, err := db.Do(ctx, receipts.Key{Scope: "s", ID: "a"}, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return []byte("ok"), nil })
		require.NoError(t, err)
		_, err = db.Do(ctx, receipts.Key{Scope: "s", ID: "a"}, []byte("fp"), func(context.Context, *receipts.Lease) ([]byte, error) { return nil, errors.New("never runs") })
		require.NoError(t, err)
		l, _, err := db.Claim(ctx, receipts.Key{Scope: "s", ID: "b"}, []byte("fp"))
		require.NoError(t, err)
		_, _, err = db.Claim(ctx, receipts.Key{Scope: "s", ID: "b"}, []byte("fp"), receipts.WaitAtMost(time.Millisecond))
		require.ErrorIs(t, err, receipts.ErrInProgress)
		require.NoError(t, l.Abandon(bg))
		_, err = db.GC(bg)
		require.NoError(t, err)
	}
	clock := receiptstest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	work(pebbleStore(t, c, clock))
	if pgtest.Available() {
		work(pgStore(t, c, clock))
	} else if os.Getenv("CI") == "true" {
		t.Fatal("no PostgreSQL server: the PostgreSQL metrics cannot be checked")
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	names, labels = map[string]bool{}, map[string]bool{"le": true, "instance": true, "job": true}
	for _, mf := range mfs {
		n := mf.GetName()
		names[n] = true
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			names[n+"_bucket"], names[n+"_sum"], names[n+"_count"] = true, true, true
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = true
			}
		}
	}
	for _, want := range []string{"receipts_wait_duration_seconds", "receipts_gc_last_run_timestamp_seconds", "receipts_pebble_wal_bytes"} {
		require.True(t, names[want], "the workload did not make %s appear", want)
	}
	return names, labels
}

func sortedKeys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// quote writes s as a YAML double-quoted scalar (JSON's escapes are valid
// there).
func quote(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}

func alertRules() string {
	var b strings.Builder
	b.WriteString("# Prometheus alerting rules for receipts (metrics of package receiptsprom).\n")
	b.WriteString("# Written by `go test ./receiptsprom -run TestMonitoring -update`; do not edit.\n")
	b.WriteString("# Runbooks: monitoring/README.md. Check: promtool check rules alerts.yml; promtool test rules alerts_test.yml\n")
	b.WriteString("groups:\n  - name: receipts\n    rules:\n")
	for _, a := range alerts {
		fmt.Fprintf(&b, "      - alert: %s\n", a.name)
		fmt.Fprintf(&b, "        expr: %s\n", quote(a.expr))
		fmt.Fprintf(&b, "        for: %s\n", a.forDur)
		fmt.Fprintf(&b, "        labels:\n          severity: %s\n", a.severity)
		fmt.Fprintf(&b, "        annotations:\n")
		fmt.Fprintf(&b, "          summary: %s\n", quote(a.summary))
		fmt.Fprintf(&b, "          description: %s\n", quote(a.description))
		fmt.Fprintf(&b, "          runbook_url: %s\n", quote(runbookBase+strings.ToLower(a.name)))
	}
	return b.String()
}

func alertTests() string {
	var b strings.Builder
	b.WriteString("# promtool unit tests: each alert of alerts.yml fires on a synthetic series, and not before.\n")
	b.WriteString("# Written by `go test ./receiptsprom -run TestMonitoring -update`; do not edit.\n")
	b.WriteString("# Run: promtool test rules alerts_test.yml\n")
	b.WriteString("rule_files:\n  - alerts.yml\nevaluation_interval: 1m\ntests:\n")
	for _, a := range alerts {
		fmt.Fprintf(&b, "  - name: %s\n    interval: 1m\n    input_series:\n", a.name)
		for _, s := range a.series {
			fmt.Fprintf(&b, "      - series: %s\n        values: %s\n", quote(s.name), quote(s.values))
		}
		fmt.Fprintf(&b, "    alert_rule_test:\n")
		fmt.Fprintf(&b, "      - eval_time: %s\n        alertname: %s\n        exp_alerts: []\n", a.quietAt, a.name)
		fmt.Fprintf(&b, "      - eval_time: %s\n        alertname: %s\n        exp_alerts:\n          - exp_labels:\n", a.fireAt, a.name)
		labels := map[string]string{"severity": a.severity}
		for k, v := range a.want {
			labels[k] = v
		}
		keys := make([]string, 0, len(labels))
		for k := range labels {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "              %s: %s\n", k, quote(labels[k]))
		}
		fmt.Fprintf(&b, "            exp_annotations:\n")
		fmt.Fprintf(&b, "              summary: %s\n", quote(a.wantSummary))
		fmt.Fprintf(&b, "              description: %s\n", quote(a.description))
		fmt.Fprintf(&b, "              runbook_url: %s\n", quote(runbookBase+strings.ToLower(a.name)))
	}
	return b.String()
}

// consoleLinks are the panels where a person must act, and the page of the operators'
// console (package receiptconsole) where they do: the dashboard's console variable is
// where the service mounts it.
var consoleLinks = map[string][2]string{
	"Abandoned claims":                  {"Settle them in the receipts console (Needs a person)", "needs"},
	"Time since the last successful GC": {"The receipts console: retention and the last GC", ""},
}

func dashboard(t *testing.T) string {
	type target struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
		RefID        string `json:"refId"`
	}
	ds := map[string]string{"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
	var ps []map[string]any
	for i, p := range panels {
		var ts []target
		for j, tg := range p.targets {
			ts = append(ts, target{Expr: tg[1], LegendFormat: tg[0], RefID: string(rune('A' + j))})
		}
		ps = append(ps, map[string]any{
			"id": i + 1, "type": "timeseries", "title": p.title, "description": p.description,
			"datasource": ds, "targets": ts,
			"gridPos":     map[string]int{"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i / 2)},
			"fieldConfig": map[string]any{"defaults": map[string]any{"unit": p.unit}, "overrides": []any{}},
			"options":     map[string]any{"legend": map[string]any{"displayMode": "list", "placement": "bottom", "showLegend": true}},
		})
		if l, ok := consoleLinks[p.title]; ok {
			ps[i]["links"] = []map[string]any{{"title": l[0], "url": "${console}" + l[1], "targetBlank": true}}
		}
	}
	for title := range consoleLinks {
		require.True(t, slices.ContainsFunc(panels, func(p panel) bool { return p.title == title }), "consoleLinks names no panel %q", title)
	}
	d := map[string]any{
		"__inputs": []map[string]string{{"name": "DS_PROMETHEUS", "label": "Prometheus", "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}},
		"title":    "receipts", "uid": "receipts-overview", "description": "receipts: calls, replays, conflicts, attempts, and the health the alerts watch, by engine and operation class. Written by go test ./receiptsprom -run TestMonitoring -update.",
		"tags": []string{"receipts"}, "timezone": "browser", "schemaVersion": 39, "version": 1, "editable": true,
		"time": map[string]string{"from": "now-6h", "to": "now"}, "refresh": "30s",
		"templating": map[string]any{"list": []any{map[string]any{
			"name": "console", "label": "receipts console URL", "type": "textbox",
			"description": "Where the service mounts receiptconsole.Handler (ending in /), or what receiptctl console printed: panels where a person must act link to its pages.",
			"query":       "http://127.0.0.1:8081/admin/console/",
			"current":     map[string]string{"text": "http://127.0.0.1:8081/admin/console/", "value": "http://127.0.0.1:8081/admin/console/"},
		}}}, "annotations": map[string]any{"list": []any{}},
		"panels": ps,
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(d))
	return buf.String()
}
