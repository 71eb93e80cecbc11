package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc/pgtest"
)

// TestMetricsListenServesMetricsApart: with --metrics-listen, each role
// built from source serves /metrics there and answers 404 for it on
// --listen, which keeps /healthz and /readyz; without it, /metrics stays
// on --listen.
func TestMetricsListenServesMetricsApart(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	ns := brokertest.NATS(t)
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY)")
	for _, tc := range []struct {
		role string
		args []string
		want string // a metric the role exports
	}{
		{"ws", []string{"ws", "--allow-anonymous", "--nats-url", ns.ClientURL()}, "fanwire_connections "},
		{"dev", []string{"dev", "--data-dir", t.TempDir()}, "fanwire_connections "},
		{"ingest", []string{"ingest", "--nats-url", ns.ClientURL(), "--pg", pg.DSN("postgres"), "--state-dir", t.TempDir()}, "fanwire_ingest_"},
	} {
		for _, apart := range []bool{true, false} {
			name := tc.role + "/on --listen"
			if apart {
				name = tc.role + "/apart"
			}
			t.Run(name, func(t *testing.T) {
				listen, metrics := listenAddr(t), listenAddr(t)
				args := append(append([]string{}, tc.args...), "--listen", listen, "--log-level", "warn")
				if apart {
					args = append(args, "--metrics-listen", metrics)
				}
				if tc.role == "ingest" {
					slot := "on_listen" // one slot per run: a killed ingest's stays held a moment
					if apart {
						slot = "apart"
					}
					args = append(args, "--slot", slot)
				}
				var logs procLogs
				cmd := logs.starter(t, bin, args)()
				t.Cleanup(func() {
					_ = cmd.Process.Kill()
					_ = cmd.Wait()
				})
				if !readyWithin(listen, 30*time.Second) {
					t.Fatalf("%s not ready on %s:\n%s", tc.role, listen, logs.dump())
				}
				code, body := get(t, "http://"+listen+"/metrics")
				if apart && code != http.StatusNotFound {
					t.Errorf("--listen /metrics with --metrics-listen: %d, want 404", code)
				}
				if !apart && (code != http.StatusOK || !strings.Contains(body, tc.want)) {
					t.Errorf("--listen /metrics without --metrics-listen: %d, want 200 with %s", code, tc.want)
				}
				if !apart {
					return
				}
				code, body = get(t, "http://"+metrics+"/metrics")
				if code != http.StatusOK || !strings.Contains(body, tc.want) || !strings.Contains(body, "go_goroutines") {
					t.Errorf("--metrics-listen /metrics: %d, want 200 with %s and go_goroutines:\n%.500s", code, tc.want, body)
				}
				if code, _ := get(t, "http://"+listen+"/healthz"); code != http.StatusOK {
					t.Errorf("--listen /healthz: %d, want 200", code)
				}
			})
		}
	}
}

// get GETs url and returns the status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
