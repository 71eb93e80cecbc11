package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/jackc/pgx/v5"
)

// dashboardFile is the Grafana dashboard users import as it is.
const dashboardFile = "../../deploy/grafana/fanwire.json"

// TestGrafanaDashboard runs every query of the Grafana dashboard against a
// real Prometheus (Debian's package) scraping a real `fanwire ws` and a
// real `fanwire ingest` under a small load (rows committed in PostgreSQL,
// through JetStream, to a WebSocket client): each returns data, and every
// fanwire metric a query names is one the two processes export.
func TestGrafanaDashboard(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not found: run `make test` (make deps installs Debian's prometheus package) or `apt-get install prometheus`")
	}
	queries := dashboardQueries(t)
	bin := buildBinary(t)
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY, v int)")
	ns := brokertest.NATS(t)
	brokerArgs := []string{"--broker", "jetstream", "--nats-url", ns.ClientURL(), "--subjects", "db.>", "--stream", "CDC"}
	ingestAddr, wsAddr, promAddr := listenAddr(t), listenAddr(t), listenAddr(t)
	var logs procLogs
	startProc := func(args ...string) {
		cmd := logs.starter(t, bin, args)()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	startProc(append([]string{"ingest", "--pg", pg.DSN("postgres"), "--listen", ingestAddr, "--log-level", "warn"}, brokerArgs...)...)
	startProc(append([]string{"ws", "--listen", wsAddr, "--allow-anonymous", "--log-level", "warn"}, brokerArgs...)...)
	for _, addr := range []string{ingestAddr, wsAddr} {
		waitHTTP(t, "http://"+addr+"/readyz", &logs)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	// A client that subscribes, makes one protocol error and reads.
	c, _, err := websocket.Dial(ctx, "ws://"+wsAddr+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CloseNow() })
	for _, m := range []string{`{"type":"subscribe","id":"s","subject":"db.>"}`, `{"type":"nonsense"}`} {
		if err := c.Write(ctx, websocket.MessageText, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	wg.Go(func() {
		for {
			if _, _, err := c.Read(ctx); err != nil {
				return
			}
		}
	})
	// Rows committed, 20 a second, until the test ends.
	wg.Go(func() {
		conn, err := pgx.Connect(ctx, pg.DSN("postgres"))
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			if _, err := conn.Exec(ctx, "INSERT INTO t VALUES ($1, $1)", i); err != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})

	dir := t.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: fanwire-ws
    static_configs: [{targets: [%q]}]
  - job_name: fanwire-ingest
    static_configs: [{targets: [%q]}]
`, wsAddr, ingestAddr)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	startPrometheus(t, promBin, dir, promAddr)

	// Every metric the queries name is exported by one of the processes.
	exported := scrapeNames(t, "http://"+wsAddr+"/metrics") + scrapeNames(t, "http://"+ingestAddr+"/metrics")
	for _, name := range metricNames(queries) {
		if !strings.Contains(exported, "# TYPE "+name+" ") {
			t.Errorf("the dashboard queries %s, which neither fanwire ws nor fanwire ingest exports", name)
		}
	}

	// Every query returns data once Prometheus has a few scrapes of both
	// (rates over 15 s need two samples; the deadline is generous).
	deadline := time.Now().Add(90 * time.Second)
	for _, q := range queries {
		expr := strings.NewReplacer("$__rate_interval", "15s", "$ws_job", "fanwire-ws", "$ingest_job", "fanwire-ingest").Replace(q.expr)
		for {
			n, err := promQuery("http://"+promAddr, expr)
			if err == nil && n > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("panel %q: %s returned no data (%v)", q.panel, expr, err)
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	if t.Failed() {
		t.Log(logs.dump())
	}
}

type dashboardQuery struct{ panel, expr string }

// dashboardQueries reads every panel's queries, and checks the
// dashboard's datasource variable: it imports into any Grafana.
func dashboardQueries(t *testing.T) []dashboardQuery {
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Templating struct {
			List []struct{ Name, Type, Query string }
		}
		Panels []struct {
			Type, Title string
			Datasource  struct{ UID string }
			Targets     []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(d.Templating.List, func(v struct{ Name, Type, Query string }) bool {
		return v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	}) {
		t.Fatal("the dashboard has no Prometheus datasource variable named datasource")
	}
	var qs []dashboardQuery
	for _, p := range d.Panels {
		if p.Type == "row" {
			continue
		}
		if p.Datasource.UID != "${datasource}" || len(p.Targets) == 0 {
			t.Errorf("panel %q: datasource %q and %d queries, want ${datasource} and some", p.Title, p.Datasource.UID, len(p.Targets))
		}
		for _, tg := range p.Targets {
			qs = append(qs, dashboardQuery{p.Title, tg.Expr})
		}
	}
	return qs
}

var metricNameRE = regexp.MustCompile(`\bfanwire_[a-z0-9_]+`)

// metricNames are the fanwire metrics queries name, a histogram's series
// by the histogram's name.
func metricNames(qs []dashboardQuery) []string {
	var names []string
	for _, q := range qs {
		for _, n := range metricNameRE.FindAllString(q.expr, -1) {
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				n = strings.TrimSuffix(n, suffix)
			}
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
	}
	slices.Sort(names)
	return names
}

func scrapeNames(t *testing.T, u string) string {
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitHTTP waits for u to answer 200.
func waitHTTP(t *testing.T, u string, logs *procLogs) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(u)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after 60 s\n%s", u, logs.dump())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startPrometheus runs Prometheus with dir's prometheus.yml, storing in
// dir, until the test ends.
func startPrometheus(t *testing.T, promBin, dir, addr string) {
	t.Helper()
	var out strings.Builder
	cmd := exec.Command(promBin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready after 60 s: %s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// promQuery runs an instant query and returns the number of series (or
// the scalar's 1) it returned.
func promQuery(base, expr string) (int, error) {
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(expr))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string
		Error  string
		Data   struct {
			ResultType string
			Result     json.RawMessage
		}
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, err
	}
	if r.Status != "success" {
		return 0, fmt.Errorf("prometheus: %s", r.Error)
	}
	if r.Data.ResultType == "scalar" {
		return 1, nil
	}
	var series []json.RawMessage
	if err := json.Unmarshal(r.Data.Result, &series); err != nil {
		return 0, err
	}
	return len(series), nil
}
