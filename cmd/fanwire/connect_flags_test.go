package main

import (
	"bytes"
	"context"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/gateway"
	"go.uber.org/zap"
)

// TestConnectLimitFlags: the connect limits' flags and FANWIRE_* variables
// become the gateway's Config (the flags' 0 "none" its negative), and a bad
// value is an error naming the flag or the variable.
func TestConnectLimitFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    gateway.Config
		wantErr string
	}{
		{name: "defaults", want: gateway.Config{MaxConnectRate: gateway.DefaultMaxConnectRate, ConnectQueue: 1024, ConnectQueueWait: 5 * time.Second}},
		{name: "set", args: []string{"--max-connect-rate", "50", "--connect-burst", "10", "--connect-queue", "20", "--connect-queue-wait", "2s", "--trusted-proxies", "10.0.0.0/8, 192.0.2.7"},
			want: gateway.Config{MaxConnectRate: 50, ConnectBurst: 10, ConnectQueue: 20, ConnectQueueWait: 2 * time.Second,
				TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32")}}},
		{name: "from the environment", env: map[string]string{"FANWIRE_MAX_CONNECT_RATE": "7", "FANWIRE_TRUSTED_PROXIES": "2001:db8::/32"},
			want: gateway.Config{MaxConnectRate: 7, ConnectQueue: 1024, ConnectQueueWait: 5 * time.Second, TrustedProxies: []netip.Prefix{netip.MustParsePrefix("2001:db8::/32")}}},
		{name: "no limit", args: []string{"--max-connect-rate", "0"}, want: gateway.Config{MaxConnectRate: -1, ConnectQueue: 1024, ConnectQueueWait: 5 * time.Second}},
		{name: "no queue", args: []string{"--connect-queue", "0"}, want: gateway.Config{MaxConnectRate: gateway.DefaultMaxConnectRate, ConnectQueue: -1}},
		{name: "no wait", args: []string{"--connect-queue-wait", "0s"}, want: gateway.Config{MaxConnectRate: gateway.DefaultMaxConnectRate, ConnectQueue: -1}},
		{name: "bad prefix", args: []string{"--trusted-proxies", "10.0.0.0/8,10.1.0.0/33"}, wantErr: `--trusted-proxies: "10.1.0.0/33"`},
		{name: "bad address", args: []string{"--trusted-proxies", "proxy.internal"}, wantErr: `--trusted-proxies: "proxy.internal"`},
		{name: "bad prefix from the environment", env: map[string]string{"FANWIRE_TRUSTED_PROXIES": "10.0.0.0/40"}, wantErr: `--trusted-proxies: "10.0.0.0/40"`},
		{name: "IPv6 prefix", args: []string{"--ip-limit-ipv6-prefix", "48"}, want: gateway.Config{IPLimitIPv6Prefix: 48, MaxConnectRate: gateway.DefaultMaxConnectRate, ConnectQueue: 1024, ConnectQueueWait: 5 * time.Second}},
		{name: "IPv6 prefix from the environment", env: map[string]string{"FANWIRE_IP_LIMIT_IPV6_PREFIX": "128"}, want: gateway.Config{IPLimitIPv6Prefix: 128, MaxConnectRate: gateway.DefaultMaxConnectRate, ConnectQueue: 1024, ConnectQueueWait: 5 * time.Second}},
		{name: "IPv6 prefix 0", args: []string{"--ip-limit-ipv6-prefix", "0"}, wantErr: "--ip-limit-ipv6-prefix: must be 1 to 128 (got 0)"},
		{name: "IPv6 prefix over 128", env: map[string]string{"FANWIRE_IP_LIMIT_IPV6_PREFIX": "129"}, wantErr: "--ip-limit-ipv6-prefix: must be 1 to 128 (got 129)"},
		{name: "IPv6 prefix not a number", env: map[string]string{"FANWIRE_IP_LIMIT_IPV6_PREFIX": "/64"}, wantErr: "FANWIRE_IP_LIMIT_IPV6_PREFIX"},
		{name: "negative burst", args: []string{"--connect-burst", "-1"}, wantErr: "--connect-burst: must not be negative"},
		{name: "not a number", args: []string{"--max-connect-rate", "fast"}, wantErr: "-max-connect-rate"},
		{name: "not a number from the environment", env: map[string]string{"FANWIRE_CONNECT_QUEUE": "many"}, wantErr: "FANWIRE_CONNECT_QUEUE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			c := newCommand("ws", "")
			c.fs.SetOutput(new(bytes.Buffer))
			var f wsFlags
			f.register(c.fs, false)
			err := c.parse(tc.args)
			var got gateway.Config
			if err == nil {
				got, err = f.connectLimits.config()
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want.IPLimitIPv6Prefix == 0 {
				tc.want.IPLimitIPv6Prefix = 64 // the flag's default, in every row that does not set it
			}
			if got.IPLimitIPv6Prefix != tc.want.IPLimitIPv6Prefix || got.MaxConnectRate != tc.want.MaxConnectRate || got.ConnectBurst != tc.want.ConnectBurst || got.ConnectQueue != tc.want.ConnectQueue ||
				got.ConnectQueueWait != tc.want.ConnectQueueWait || !slices.Equal(got.TrustedProxies, tc.want.TrustedProxies) {
				t.Fatalf("config %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestBadTrustedProxiesFailsAtStart: fanwire ws with a bad
// --trusted-proxies exits at start, naming the flag and the entry, before
// connecting to anything (the NATS server here does not exist).
func TestBadTrustedProxiesFailsAtStart(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"ws", "--nats-url", "nats://127.0.0.1:1", "--allow-anonymous", "--trusted-proxies", "10.0.0.0/8,10.0.0.0/99",
		"--listen", "127.0.0.1:0", "--log-level", "error"}, &out, &errOut)
	if code != 1 || !strings.Contains(errOut.String(), `--trusted-proxies: "10.0.0.0/99"`) || strings.Contains(errOut.String(), "nats") {
		t.Fatalf("exit %d, stderr %q; want 1 and an error naming --trusted-proxies and the bad entry", code, errOut.String())
	}
}

// TestTrustedProxiesReachTheServer: with FANWIRE_TRUSTED_PROXIES naming
// the test's own address, fanwire ws counts --max-connections-per-ip by
// the X-Forwarded-For address.
func TestTrustedProxiesReachTheServer(t *testing.T) {
	t.Setenv("FANWIRE_TRUSTED_PROXIES", "127.0.0.1")
	addr := startWS(t, zap.NewNop(), "--allow-anonymous", "--max-connections-per-ip", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dial := func(client string) (*http.Response, error) {
		c, resp, err := websocket.Dial(ctx, "ws://"+addr+"/ws", &websocket.DialOptions{HTTPHeader: http.Header{"X-Forwarded-For": {client}}})
		if err == nil {
			t.Cleanup(func() { _ = c.CloseNow() })
		}
		return resp, err
	}
	for _, client := range []string{"198.51.100.1", "198.51.100.2"} {
		if _, err := dial(client); err != nil {
			t.Fatalf("client %s: %v", client, err)
		}
	}
	if resp, err := dial("198.51.100.1"); err == nil || resp == nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("client 198.51.100.1 again: %v, %v; want 429", resp, err)
	}
}
