package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestLoadtestChurnFlags: a churn soak is a test of its own, its event
// count is derived, and a spawned gateway's metrics URL is the loadtest's
// to know; a storm spawns its own two ws nodes on a durable broker; each
// misuse is refused before anything connects, naming it.
func TestLoadtestChurnFlags(t *testing.T) {
	existing := []string{"--url", "ws://127.0.0.1:1/ws", "--nats", "nats://127.0.0.1:1"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append([]string{"--churn", "5s", "--idle", "1s"}, existing...), "--churn is a test of its own"},
		{append([]string{"--churn", "5s", "--resume", "0.5", "--broker", "jetstream"}, existing...), "--churn is a test of its own"},
		{append([]string{"--churn", "5s", "--events", "100"}, existing...), "Events 100 with Churn"},
		{append([]string{"--churn", "5s", "--churn-baseline", "20s"}, existing...), "ChurnSettle 15s is shorter than ChurnBaseline 20s"},
		{[]string{"--spawn", "--churn", "5s", "--metrics-url", "http://127.0.0.1:1/metrics"}, "drop --url, --graphql-url, --nats, --metrics-url and --pid"},
		{append([]string{"--publish-via", "grpc"}, existing...), `--publish-via "grpc": want broker, ws or http`},
		{append([]string{"--publish-via", "ws", "--rate", "100"}, existing...), "Rate paces the broker publisher"},
		{append([]string{"--spawn-binary", "/bin/true"}, existing...), "--spawn-binary applies to a gateway this run spawns"},
		{[]string{"--spawn", "--spawn-binary", "/nonexistent/fanwire"}, "--spawn-binary: exec: \"/nonexistent/fanwire\""},
		{append([]string{"--storm"}, existing...), "--storm spawns its two nodes"},
		{[]string{"--storm", "--spawn", "--spawn-role", "ws"}, "--storm spawns its two nodes"}, // Core NATS keeps no cursors
		{[]string{"--storm", "--spawn", "--spawn-role", "dev", "--broker", "jetstream"}, "--storm spawns its two nodes"},
		{[]string{"--storm", "--spawn", "--spawn-role", "ws", "--broker", "jetstream", "--idle", "1s"}, "--storm is a test of its own"},
		{append([]string{"--storm-after", "5"}, existing...), "--storm-after and --storm-seed apply to --storm"},
		{[]string{"--storm", "--spawn", "--spawn-role", "ws", "--broker", "jetstream", "--spawn-binary", "/nonexistent/fanwire"}, "--spawn-binary: exec: \"/nonexistent/fanwire\""},
	} {
		var out, errOut bytes.Buffer
		code := run(append([]string{"loadtest"}, tc.args...), &out, &errOut)
		if code != 1 || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("loadtest %s: exit %d, %q; want exit 1 and %q", strings.Join(tc.args, " "), code, errOut.String(), tc.want)
		}
	}
}
