package main

import (
	"io"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/goccy/go-yaml"
)

// alertRulesFile is the rules users load as they are; promtool tests the
// alerts themselves (make rules-check), this file their metric names.
const alertRulesFile = "../../deploy/prometheus/fanwire-alerts.yml"

// TestAlertRulesUseExportedMetrics: every fanwire_* metric an alert rule
// names is exported by a real `fanwire ws` (with TLS, on NATS) or a real
// `fanwire ingest` (on PostgreSQL, after one change), built from source: a
// renamed or removed metric fails here instead of leaving an alert that
// can never fire.
func TestAlertRulesUseExportedMetrics(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	used := alertRuleMetrics(t)
	if len(used) < 10 {
		t.Fatalf("%d fanwire_* metrics found in %s: the file did not parse as expected", len(used), alertRulesFile)
	}

	bin := buildBinary(t)
	ns := brokertest.NATS(t)
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY)")
	ca := brokertest.NewCA(t)
	cert, key := ca.Issue(t, t.TempDir(), "ws")

	var logs procLogs
	start := func(args ...string) (listen, metrics string) {
		t.Helper()
		listen, metrics = listenAddr(t), listenAddr(t)
		cmd := logs.starter(t, bin, append(args, "--nats-url", ns.ClientURL(), "--listen", listen, "--metrics-listen", metrics, "--log-level", "warn"))()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
		return listen, metrics
	}
	_, wsMetrics := start("ws", "--allow-anonymous", "--tls-cert", cert, "--tls-key", key)
	ingestListen, ingestMetrics := start("ingest", "--pg", pg.DSN("postgres"), "--state-dir", t.TempDir(), "--slot", "alerts")
	if !readyWithin(ingestListen, 30*time.Second) {
		t.Fatalf("the ingest is not tailing within 30 s:\n%s", logs.dump())
	}
	// A change, so that the ingest has received WAL messages
	// (fanwire_wal_messages_total has a series per kind seen).
	pg.Exec("postgres", "INSERT INTO t VALUES (1)")

	// The roles export some series once something happened: scrape until
	// every name is there, or a generous deadline passes.
	var missing []string
	for deadline := time.Now().Add(30 * time.Second); ; {
		exported := scrapeSeriesNames(wsMetrics)
		for n := range scrapeSeriesNames(ingestMetrics) {
			exported[n] = true
		}
		missing = missing[:0]
		for _, n := range used {
			if !exported[n] {
				missing = append(missing, n)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(missing) > 0 {
		t.Errorf("%s uses metrics that neither role exports: %s\n%s", alertRulesFile, strings.Join(missing, ", "), logs.dump())
	}
}

// alertRuleMetrics returns the fanwire_* names the rules' expressions use,
// sorted.
func alertRuleMetrics(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(alertRulesFile)
	if err != nil {
		t.Fatal(err)
	}
	var file struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &file); err != nil {
		t.Fatalf("%s: %v", alertRulesFile, err)
	}
	name := regexp.MustCompile(`\bfanwire_[a-z0-9_]+`)
	var used []string
	for _, g := range file.Groups {
		for _, r := range g.Rules {
			if r.Expr == "" {
				t.Errorf("%s: rule %q has no expr", alertRulesFile, r.Alert)
			}
			for _, n := range name.FindAllString(r.Expr, -1) {
				if !slices.Contains(used, n) {
					used = append(used, n)
				}
			}
		}
	}
	slices.Sort(used)
	return used
}

// scrapeSeriesNames returns the series names addr's /metrics exports: a
// family's name, and for a histogram or summary its _bucket, _sum and
// _count series.
func scrapeSeriesNames(addr string) map[string]bool {
	names := make(map[string]bool)
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return names // not listening yet
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return names
	}
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		n, _, _ := strings.Cut(line, " ")
		n, _, _ = strings.Cut(n, "{")
		names[n] = true
	}
	return names
}
