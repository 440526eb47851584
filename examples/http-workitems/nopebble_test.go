package main

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/receiptstore/receipts/internal/pgtest"
)

// The service builds with -tags receipts_nopebble (docs/postgresql.md, "A
// PostgreSQL-only build"): the build links no Pebble package, its Pebble
// default (-dir) fails at start saying -pg is the way, and on PostgreSQL it
// serves: one create, its replay, and the store's metrics.
func TestPostgreSQLOnlyBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the service")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build with:", err)
	}
	deps := func(tags ...string) []string {
		t.Helper()
		out, err := exec.Command(goBin, append(append([]string{"list"}, tags...), "-deps", ".")...).Output()
		if err != nil {
			t.Fatalf("go list %s: %v", strings.Join(tags, " "), err)
		}
		return strings.Fields(string(out))
	}
	pebbleOnes := func(pkgs []string) (out []string) {
		for _, p := range pkgs {
			if strings.Contains(p, "cockroachdb") || strings.HasSuffix(p, "/pebblestore") || strings.HasSuffix(p, "/pebbleengine") {
				out = append(out, p)
			}
		}
		return out
	}
	if n := len(pebbleOnes(deps())); n == 0 {
		t.Fatal("the default build links no Pebble package: this test would prove nothing")
	}
	if p := pebbleOnes(deps("-tags", "receipts_nopebble")); len(p) != 0 {
		t.Fatalf("with -tags receipts_nopebble the service still links %d Pebble packages: %s", len(p), strings.Join(p, " "))
	}

	bin := filepath.Join(t.TempDir(), "http-workitems-pg")
	if out, err := exec.Command(goBin, "build", "-tags", "receipts_nopebble", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -tags receipts_nopebble: %v\n%s", err, out)
	}

	// Without -pg: the Pebble default is not there, and the service says so.
	out, err := exec.Command(bin, "-dir", t.TempDir(), "-addr", "127.0.0.1:0", "-admin", "").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "receipts_nopebble") || !strings.Contains(string(out), "give -pg") {
		t.Fatalf("-dir in a PostgreSQL-only build: err %v, output:\n%s", err, out)
	}

	dsn, schema := pgtest.Schema(t)
	cmd := exec.Command(bin, "-pg="+dsn, "-schema", schema, "-addr", "127.0.0.1:0", "-admin", "127.0.0.1:0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var (
		log     syncBuffer
		waitErr error
		exited  = make(chan struct{}) // closed once the service has exited (waitErr)
	)
	addrs := make(chan string, 2)
	go func() {
		listening := regexp.MustCompile(`msg=listening addr=(\S+)`)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			log.Write(append(sc.Bytes(), '\n'))
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				addrs <- m[1]
			}
		}
		_, _ = io.Copy(&log, stderr)
		waitErr = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	var api, admin string
	for _, a := range []*string{&api, &admin} {
		select {
		case *a = <-addrs:
		case <-exited:
			t.Fatalf("the service exited: %v\n%s", waitErr, log.String())
		case <-time.After(time.Minute):
			t.Fatalf("the service does not listen after a minute:\n%s", log.String())
		}
	}

	c := &client{t: t, http: &http.Client{Timeout: 30 * time.Second}}
	for i, want := range []string{"", "true"} {
		r := c.post("http://"+api, "op-1", `{"title":"t"}`)
		if r.StatusCode != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != want {
			b, _ := io.ReadAll(r.Body)
			t.Fatalf("request %d: %d replayed %q: %s\n%s", i, r.StatusCode, r.Header.Get("Idempotent-Replayed"), b, log.String())
		}
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+admin+"/metrics", nil)
	if err != nil {
		t.Fatal(err)
	}
	r := c.do(req)
	body, _ := io.ReadAll(r.Body)
	if want := `receipts_claims_total{class="create_work_item",engine="postgres",outcome="replayed"} 1`; r.StatusCode != http.StatusOK || !bytes.Contains(body, []byte(want)) {
		t.Fatalf("/metrics: %d, lacks %s:\n%s", r.StatusCode, want, body)
	}

	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("the service's exit: %v\n%s", waitErr, log.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("the service does not stop on SIGINT:\n%s", log.String())
	}
}

// syncBuffer is a bytes.Buffer that one goroutine writes and another reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
