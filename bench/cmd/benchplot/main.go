// Command benchplot draws receiptbench's results as SVG (or PNG) charts,
// with gonum.org/v1/plot: for each workload and engine, the ratio to the
// engine's floor against the number of callers, and the p50 and p99
// latency against the number of callers. Give it one or more runs saved
// with `receiptbench -json`: each run is a side-by-side measurement (every
// store in the same run, back to back), so its ratios are comparable; with
// several runs a line goes through the median and every run's point is
// drawn, so the spread shows.
//
//	cd bench
//	go run ./cmd/receiptbench -json > run1.json   # (and run2.json, run3.json)
//	go run ./cmd/benchplot -out ../docs/img run1.json run2.json run3.json
//
// It writes ratio-WORKLOAD-ENGINE.svg and latency-WORKLOAD-ENGINE.svg
// (-format png for PNG), and prints the files it wrote.
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// result is the part of a receiptbench -json result the charts use.
type result struct {
	Workload     string        `json:"workload"`
	Store        string        `json:"store"`
	Conc         int           `json:"conc"`
	P50          time.Duration `json:"p50_ns"`
	P99          time.Duration `json:"p99_ns"`
	RatioToFloor float64       `json:"ratio_to_floor"`
	RatioToPGFl  float64       `json:"ratio_to_pg_floor"`
	Error        string        `json:"error"`
}

type run struct {
	Machine struct {
		CPU        string
		CPUs       int
		GOMAXPROCS int
		Go         string
	} `json:"machine"`
	Results []result `json:"results"`
}

// engines: the floor each store is measured against, and the stores drawn
// on the engine's charts (floor first).
var engines = []struct {
	name, floor string
	stores      []string
	ratio       func(result) float64
}{
	{"pebble", "pebble-floor", []string{"pebble-floor", "receipts", "bbolt", "sqlite", "postgres"}, func(r result) float64 { return r.RatioToFloor }},
	{"postgres", "pg-floor", []string{"pg-floor", "receipts-pg", "receipts-pg-tx", "fgi-style", "postgres"}, func(r result) float64 { return r.RatioToPGFl }},
}

func main() {
	out := flag.String("out", ".", "directory to write the charts to")
	format := flag.String("format", "svg", "svg or png")
	title := flag.String("title", "", "a line under each chart's title (for example the machine and date)")
	md := flag.String("md", "", "also write the charts' numbers to this file as Markdown tables: the median ratio to the floor and p50/p99, with every run's ratio")
	flag.Parse()
	if flag.NArg() == 0 || (*format != "svg" && *format != "png") {
		fmt.Fprintln(os.Stderr, "usage: benchplot [-out DIR] [-format svg|png] [-title TEXT] RUN.json...")
		os.Exit(2)
	}
	runs, err := load(flag.Args())
	if err == nil {
		err = os.MkdirAll(*out, 0o755)
	}
	if err == nil {
		err = drawAll(os.Stdout, runs, *out, *format, *title)
	}
	if err == nil && *md != "" {
		err = writeTables(*md, runs)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchplot:", err)
		os.Exit(1)
	}
}

func load(paths []string) ([]run, error) {
	var runs []run
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		var r run
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		if len(r.Results) == 0 {
			return nil, fmt.Errorf("%s: no results (a receiptbench -json run of its default comparison?)", p)
		}
		runs = append(runs, r)
	}
	return runs, nil
}

// drawAll writes every chart the runs have data for and names them on w.
func drawAll(w io.Writer, runs []run, dir, format, subtitle string) error {
	workloads := map[string]bool{}
	for _, r := range runs {
		for _, x := range r.Results {
			workloads[x.Workload] = true
		}
	}
	wrote := 0
	for _, wl := range sortedKeys(workloads) {
		for _, eng := range engines {
			ratio := series(runs, wl, eng.stores, eng.ratio)
			if len(ratio) < 2 { // the floor alone says nothing
				continue
			}
			p := newPlot(fmt.Sprintf("%s: ratio to %s (higher is better)", wl, eng.floor), subtitle, "callers (log scale)", "ratio to "+eng.floor)
			if err := addLines(p, ratio, eng.stores, false); err != nil {
				return err
			}
			if err := save(w, p, filepath.Join(dir, fmt.Sprintf("ratio-%s-%s.%s", wl, eng.name, format))); err != nil {
				return err
			}
			lat := latency(runs, wl, eng.stores)
			p = newPlot(fmt.Sprintf("%s on %s: latency, p50 (solid) and p99 (dashed)", wl, eng.name), subtitle, "callers (log scale)", "latency (ms, log scale)")
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
			if err := addLines(p, lat, eng.stores, true); err != nil {
				return err
			}
			if err := save(w, p, filepath.Join(dir, fmt.Sprintf("latency-%s-%s.%s", wl, eng.name, format))); err != nil {
				return err
			}
			wrote += 2
		}
	}
	if wrote == 0 {
		return errors.New("no workload has a floor and another store in these runs")
	}
	return nil
}

// points is one store's values by number of callers, one value per run.
type points map[int][]float64

// series collects value(r) of each store's results for workload wl.
func series(runs []run, wl string, stores []string, value func(result) float64) map[string]points {
	out := map[string]points{}
	for _, r := range runs {
		for _, x := range r.Results {
			if x.Workload != wl || x.Error != "" || !slices.Contains(stores, x.Store) {
				continue
			}
			v := value(x)
			if v <= 0 || math.IsNaN(v) {
				continue
			}
			if out[x.Store] == nil {
				out[x.Store] = points{}
			}
			out[x.Store][x.Conc] = append(out[x.Store][x.Conc], v)
		}
	}
	return out
}

// latency collects p50 (under the store's name) and p99 (name + " p99"),
// in milliseconds.
func latency(runs []run, wl string, stores []string) map[string]points {
	out := series(runs, wl, stores, func(r result) float64 { return float64(r.P50) / 1e6 })
	for s, ps := range series(runs, wl, stores, func(r result) float64 { return float64(r.P99) / 1e6 }) {
		out[s+" p99"] = ps
	}
	return out
}

func newPlot(title, subtitle, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	if subtitle != "" {
		p.Title.Text += "\n" + subtitle
	}
	p.X.Label.Text, p.Y.Label.Text = x, y
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = callerTicks{}
	p.Legend.Top, p.Legend.Left = true, true
	p.Add(plotter.NewGrid())
	return p
}

// callerTicks marks 1, 2, 4, 8, ... callers.
type callerTicks struct{}

func (callerTicks) Ticks(min, max float64) []plot.Tick {
	var ts []plot.Tick
	for c := 1.0; c <= max*1.01; c *= 2 {
		if c >= min*0.99 {
			ts = append(ts, plot.Tick{Value: c, Label: fmt.Sprint(c)})
		}
	}
	return ts
}

// addLines draws a line through the median of each store's runs, and every
// run's point. With p99, "store p99" is drawn dashed in the store's color.
func addLines(p *plot.Plot, data map[string]points, stores []string, p99 bool) error {
	for i, s := range stores {
		for _, name := range []string{s, s + " p99"} {
			ps, ok := data[name]
			if !ok || (name != s && !p99) {
				continue
			}
			concs := make([]int, 0, len(ps))
			for c := range ps {
				concs = append(concs, c)
			}
			sort.Ints(concs)
			line, all := make(plotter.XYs, 0, len(concs)), plotter.XYs{}
			for _, c := range concs {
				line = append(line, plotter.XY{X: float64(c), Y: median(ps[c])})
				for _, v := range ps[c] {
					all = append(all, plotter.XY{X: float64(c), Y: v})
				}
			}
			l, err := plotter.NewLine(line)
			if err != nil {
				return err
			}
			col := plotutil.Color(i)
			l.Color, l.Width = col, vg.Points(1.5)
			if name != s {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			}
			sc, err := plotter.NewScatter(all)
			if err != nil {
				return err
			}
			sc.GlyphStyle = draw.GlyphStyle{Color: faded(col), Radius: vg.Points(2), Shape: draw.CircleGlyph{}}
			p.Add(l, sc)
			p.Legend.Add(name, l)
		}
	}
	return nil
}

func faded(c color.Color) color.Color {
	r, g, b, _ := c.RGBA()
	return color.NRGBA{R: uint8(r >> 8), G: uint8(g >> 8), B: uint8(b >> 8), A: 110}
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func save(w io.Writer, p *plot.Plot, path string) error {
	if err := p.Save(7*vg.Inch, 4.5*vg.Inch, path); err != nil {
		return err
	}
	fmt.Fprintln(w, path)
	return nil
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// writeTables writes, per workload and engine, a Markdown table of what the
// charts show: for each store and number of callers, the median ratio to
// the floor (each run's in brackets) and the median p50 and p99.
func writeTables(path string, runs []run) error {
	var b strings.Builder
	fmt.Fprintf(&b, "<!-- written by bench/cmd/benchplot -md from %d receiptbench -json runs; do not edit -->\n", len(runs))
	workloads := map[string]bool{}
	concs := map[int]bool{}
	for _, r := range runs {
		for _, x := range r.Results {
			workloads[x.Workload], concs[x.Conc] = true, true
		}
	}
	cs := make([]int, 0, len(concs))
	for c := range concs {
		cs = append(cs, c)
	}
	sort.Ints(cs)
	for _, wl := range sortedKeys(workloads) {
		for _, eng := range engines {
			ratio := series(runs, wl, eng.stores, eng.ratio)
			if len(ratio) < 2 {
				continue
			}
			p50 := series(runs, wl, eng.stores, func(r result) float64 { return float64(r.P50) })
			p99 := series(runs, wl, eng.stores, func(r result) float64 { return float64(r.P99) })
			fmt.Fprintf(&b, "\n**%s, %s**: ratio to %s, median of the runs (each run), and median p50 / p99\n\n", wl, eng.name, eng.floor)
			b.WriteString("| store |")
			for _, c := range cs {
				fmt.Fprintf(&b, " %d %s |", c, map[bool]string{true: "caller", false: "callers"}[c == 1])
			}
			b.WriteString("\n|---|")
			for range cs {
				b.WriteString("---|")
			}
			b.WriteString("\n")
			for _, s := range eng.stores {
				if ratio[s] == nil {
					continue
				}
				fmt.Fprintf(&b, "| %s |", s)
				for _, c := range cs {
					v := ratio[s][c]
					if len(v) == 0 {
						b.WriteString(" - |")
						continue
					}
					each := make([]string, len(v))
					for i, x := range v {
						each[i] = fmt.Sprintf("%.2f", x)
					}
					fmt.Fprintf(&b, " **%.2f** (%s); %s / %s |", median(v), strings.Join(each, ", "),
						time.Duration(median(p50[s][c])).Round(roundTo(median(p50[s][c]))), time.Duration(median(p99[s][c])).Round(roundTo(median(p99[s][c]))))
				}
				b.WriteString("\n")
			}
		}
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// roundTo keeps three significant digits of a duration of d nanoseconds.
func roundTo(d float64) time.Duration {
	r := time.Duration(1)
	for float64(r)*1000 <= d {
		r *= 10
	}
	return r
}
