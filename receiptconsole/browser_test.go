package receiptconsole_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/accessibility"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/receiptstore/receipts"
	"github.com/receiptstore/receipts/receiptconsole"
	"github.com/stretchr/testify/require"
)

// EnvUpdateScreenshots makes TestBrowser rewrite the screenshots in docs/ (as the
// transcripts are rewritten): RECEIPTS_UPDATE_SCREENSHOTS=1 go test -run TestBrowser ./receiptconsole
const envUpdateScreenshots = "RECEIPTS_UPDATE_SCREENSHOTS"

// browser starts headless Chromium (Debian's package, found on PATH; nothing is
// downloaded) and returns a context to drive it; it is stopped when t ends. Without
// Chromium the test is skipped, or fails under CI=true.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("the browser test must run in CI: no chromium on PATH (apt-get install chromium; .ci/run installs it)")
		}
		t.Skip("no chromium on PATH: apt-get install chromium to run the browser test")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // as root in a container
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 800),
		chromedp.WSURLReadTimeout(60*time.Second),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx) // closes the browser and waits for it
		cancel()
		cancelAlloc()
	})
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "starting %s", path)
	return ctx
}

// TestBrowser drives a real browser against the console of a real store on each engine,
// as an operator does, with the keyboard: the overview shows the unknown outcome; Needs a
// person lists it; a page of another site cannot settle it (its POST is refused); the
// settle form records the HTTP response its retries get, the confirmation typed key by
// key; and a real retry through receipthttp then gets that response, without running the
// handler again.
func TestBrowser(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			if testing.Short() {
				t.Skip("-short")
			}
			db := e.open(t, nil)
			svc := newService(t, db)
			for i := range 5 {
				status, _, _ := svc.order(t, "alice", fmt.Sprintf("op-%d", i))
				require.Equal(t, http.StatusCreated, status)
			}
			svc.abandonHTTP(t, "alice", "op-lost")
			runs := svc.runs.Load()
			cs := serveConsole(t, db, &receiptconsole.Options{Logger: quiet})
			ctx := browser(t)
			ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()

			require.NoError(t, chromedp.Do(ctx,
				chromedp.Navigate(cs.url("")),
				chromedp.WaitVisible(chromedp.CSS(`main`)),
			))
			overview := mainText(t, ctx)
			namedControls(t, ctx)
			require.Contains(t, overview, "1 unknown outcome waiting")
			screenshot(t, ctx, e.name, "console-overview.png")

			// Needs a person, reached by keyboard from the overview's link.
			require.NoError(t, chromedp.Do(ctx,
				chromedp.Focus(chromedp.CSS(`a[href="needs"]`)),
				chromedp.KeyEvent(kb.Enter),
				chromedp.WaitVisible(chromedp.Search(`//h1[text()="Needs a person"]`)),
			))
			needs := mainText(t, ctx)
			namedControls(t, ctx)
			require.Contains(t, needs, "op-lost")
			require.Contains(t, needs, db.ProviderKey(receipts.Key{Scope: "alice", ID: "op-lost"}))

			// Open its settle form.
			require.NoError(t, chromedp.Do(ctx,
				chromedp.Focus(chromedp.Search(`//tr[td/code[text()="op-lost"]]//a[text()="Settle"]`)),
				chromedp.KeyEvent(kb.Enter),
				chromedp.WaitVisible(chromedp.ID(`confirm`)),
			))
			settleURL, err := chromedp.Run(ctx, chromedp.Location())
			require.NoError(t, err)
			require.NotContains(t, settleURL, "op-lost", "the settle page's URL names the key")

			// A page of another site posts the same form: refused, nothing changes.
			crossSitePost(t, ctx, cs)
			require.Len(t, abandoned(t, db), 1)

			// Every control has an accessible name, and every field and the button are
			// reached with Tab, in the order of the form.
			require.NoError(t, chromedp.Do(ctx,
				chromedp.Navigate(settleURL),
				chromedp.WaitVisible(chromedp.ID(`confirm`)),
			))
			namedControls(t, ctx)
			require.Equal(t, []string{"select#outcome", "input#status", "textarea#headers", "textarea#body", "input#confirm", "button:Settle"},
				tabOrder(t, ctx, "select#outcome", "button:Settle"))

			// Fill the HTTP face's form by keyboard and submit with Enter.
			require.NoError(t, chromedp.Do(ctx,
				chromedp.Clear(chromedp.ID(`status`)),
				chromedp.SendKeys(chromedp.ID(`status`), "201"),
				chromedp.SendKeys(chromedp.ID(`headers`), "Content-Type: application/json"),
				chromedp.SendKeys(chromedp.ID(`body`), `{"order":"settled by an operator"}`),
				chromedp.SendKeys(chromedp.ID(`confirm`), "op-lost"),
			))
			dialog := mainText(t, ctx)
			require.Contains(t, dialog, "What a retry gets afterwards")
			screenshot(t, ctx, e.name, "console-settle.png")
			require.NoError(t, chromedp.Do(ctx,
				chromedp.SendKeys(chromedp.ID(`confirm`), kb.Enter),
				chromedp.WaitVisible(chromedp.CSS(`.flash`)),
			))
			after := mainText(t, ctx)
			require.Contains(t, after, "Settled")
			require.Contains(t, after, "succeeded")
			require.Empty(t, abandoned(t, db))

			status, body, replayed := svc.order(t, "alice", "op-lost")
			require.Equal(t, http.StatusCreated, status)
			require.JSONEq(t, `{"order":"settled by an operator"}`, body)
			require.True(t, replayed)
			require.Equal(t, runs, svc.runs.Load(), "the retry ran the handler again")
		})
	}
}

// crossSitePost opens a page of another origin (localhost, another port) whose form posts
// the settle form to the console, submits it, and requires the console's refusal.
func crossSitePost(t *testing.T, ctx context.Context, cs *consoleServer) {
	t.Helper()
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprintf(w, `<!doctype html><html lang="en"><title>win a prize</title>
<form method="post" action="%s"><input name="outcome" value="not_performed"><input name="confirm" value="op-lost">
<button id="go" type="submit">Claim your prize</button></form></html>`, cs.url("settle"))
	}))
	defer evil.Close()
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1)
	require.NoError(t, chromedp.Do(ctx,
		chromedp.Navigate(evilURL),
		chromedp.WaitVisible(chromedp.ID(`go`)),
		chromedp.Click(chromedp.ID(`go`)),
		chromedp.WaitVisible(chromedp.Search(`//h1[text()="Forbidden"]`)),
	))
	require.Contains(t, mainText(t, ctx), "cross-site")
}

// screenshot saves the page into docs/name when RECEIPTS_UPDATE_SCREENSHOTS=1 (from the
// Pebble run only).
func screenshot(t *testing.T, ctx context.Context, engine, name string) {
	t.Helper()
	if os.Getenv(envUpdateScreenshots) != "1" || engine != "pebble" {
		return
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join("..", "docs", name), png, 0o644))
	t.Logf("wrote docs/%s", name)
}

// mainText is the text of the page's main element.
func mainText(t *testing.T, ctx context.Context) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(`main`)))
	require.NoError(t, err)
	return s
}

// tabOrder presses Tab from the top of the page and returns the focused elements (tag#id,
// or button:text) from the first that is first to the first that is last.
func tabOrder(t *testing.T, ctx context.Context, first, last string) []string {
	t.Helper()
	const focused = `(e => e.tagName.toLowerCase() + (e.id ? "#" + e.id : "") + (e.tagName === "BUTTON" ? ":" + e.textContent.trim() : ""))(document.activeElement)`
	var order []string
	for range 40 {
		require.NoError(t, chromedp.Do(ctx, chromedp.KeyEvent(kb.Tab)))
		el, err := chromedp.Run(ctx, chromedp.Evaluate[string](focused))
		require.NoError(t, err)
		if el == first || len(order) > 0 {
			order = append(order, el)
		}
		if el == last {
			return order
		}
	}
	t.Fatalf("Tab never reached %s (reached %v)", last, order)
	return nil
}

// namedControls requires every control of the page (link, button, text field, select) to
// have an accessible name, as the browser computes it for assistive technology (its
// accessibility tree): a label that is not tied to its field, or an empty button, fails.
func namedControls(t *testing.T, ctx context.Context) {
	t.Helper()
	tree, err := chromedp.Call(ctx, accessibility.GetFullAXTree, accessibility.GetFullAXTreeParams{})
	require.NoError(t, err)
	controls := 0
	for _, n := range tree.Nodes {
		if n.Ignored || n.Role == nil {
			continue
		}
		role := strings.Trim(string(n.Role.Value), `"`)
		switch role {
		case "link", "button", "textbox", "combobox", "spinbutton", "checkbox", "radio", "listbox":
		default:
			continue
		}
		controls++
		name := ""
		if n.Name != nil {
			name = strings.Trim(string(n.Name.Value), `"`)
		}
		require.NotEmpty(t, strings.TrimSpace(name), "a %s without an accessible name (node %s)", role, n.NodeID)
	}
	require.NotZero(t, controls, "no controls in the accessibility tree")
}

// TestBrowserSettleStep drives a real browser through settling the uncertain step of an
// action of several steps: the key page marks the step, Needs a person names it and its
// provider key and links to its Settle step form, which is filled by keyboard (the step's
// name typed to confirm), and a real retry then resumes the action after the settled step.
func TestBrowserSettleStep(t *testing.T) {
	for _, e := range engines {
		t.Run(e.name, func(t *testing.T) {
			if testing.Short() {
				t.Skip("-short")
			}
			db := e.open(t, nil)
			k := receipts.Key{Scope: "dave", ID: "trip-1"}
			abandonTrip(t, db, k)
			cs := serveConsole(t, db, &receiptconsole.Options{Logger: quiet})
			ctx := browser(t)
			ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			defer cancel()

			require.NoError(t, chromedp.Do(ctx,
				chromedp.Navigate(cs.url("key?scope=dave&id=trip-1")),
				chromedp.WaitVisible(chromedp.CSS(`table.steps`)),
			))
			namedControls(t, ctx)
			page := mainText(t, ctx)
			require.Contains(t, page, "Uncertain: started, outcome unknown")
			require.Contains(t, page, "Step 1 charge is uncertain")
			steps, err := db.Steps(bg, k)
			require.NoError(t, err)

			require.NoError(t, chromedp.Do(ctx,
				chromedp.Navigate(cs.url("needs")),
				chromedp.WaitVisible(chromedp.CSS(`table`)),
			))
			needs := mainText(t, ctx)
			require.Contains(t, needs, "uncertain: step 1 charge, provider key "+steps[1].ProviderKey)
			require.NoError(t, chromedp.Do(ctx,
				chromedp.Focus(chromedp.Search(`//tr[contains(., "trip-1")]//a[text()="Settle step"]`)),
				chromedp.KeyEvent(kb.Enter),
				chromedp.WaitVisible(chromedp.ID(`confirm`)),
			))
			namedControls(t, ctx)
			require.Equal(t, []string{"select#outcome", "textarea#result", "input#confirm", "button:Settle step"},
				tabOrder(t, ctx, "select#outcome", "button:Settle step"))
			require.NoError(t, chromedp.Do(ctx,
				chromedp.SendKeys(chromedp.ID(`result`), "ch_77"),
				chromedp.SendKeys(chromedp.ID(`confirm`), "charge"),
				chromedp.SendKeys(chromedp.ID(`confirm`), kb.Enter),
				chromedp.WaitVisible(chromedp.CSS(`.flash`)),
			))
			after := mainText(t, ctx)
			require.Contains(t, after, "Step settled")
			require.NotContains(t, after, "Uncertain")

			a := newTrip("")
			r, err := db.Do(bg, k, tripFP, a.fn)
			require.NoError(t, err)
			require.Equal(t, "reserve-done,ch_77,notify-done", string(r.Result))
			require.Equal(t, map[string]int{"notify": 1}, a.runs)
		})
	}
}
