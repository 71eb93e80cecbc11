package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"go.uber.org/zap"
)

// TestWSSecured: fanwire ws talks to a NATS server that wants a .creds
// user and TLS with a client certificate (flags and FANWIRE_* variables),
// serves HTTPS and wss:// itself with --tls-cert and --tls-key, and a new
// connection sees a renewed certificate once its files are replaced.
func TestWSSecured(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	ca := brokertest.NewCA(t)
	ns := brokertest.NATSSecure(t, brokertest.SecureNATSConfig{CA: ca, VerifyClients: true, Auth: "creds"})
	dir := t.TempDir()
	certFile, keyFile := ca.Issue(t, dir, "gateway")
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	listen := "127.0.0.1:" + strconv.Itoa(port)
	t.Setenv("FANWIRE_NATS_CREDS", ns.CredsFile)
	t.Setenv("FANWIRE_NATS_TLS_CA", ca.File)
	t.Setenv("FANWIRE_TLS_KEY", keyFile)
	c := newCommand("ws", "")
	var f wsFlags
	f.register(c.fs, false)
	if err := c.parse([]string{"--listen", listen, "--nats-url", ns.Server.ClientURL(), "--allow-anonymous", "--allow-anonymous-publish",
		"--nats-tls-cert", ns.ClientCert, "--nats-tls-key", ns.ClientKey, "--tls-cert", certFile}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- serveGateway(ctx, zap.NewNop(), &f, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("serveGateway: %v", err)
		}
	})
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}, DisableKeepAlives: true}}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := client.Get("https://" + listen + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("fanwire ws not ready over https: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// fanwire health probes it with the CA (a certificate for 127.0.0.1,
	// or one for another name with --tls-server-name), and not without.
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--tls-ca", ca.File}, 0, ""},
		{[]string{"--tls-ca", ca.File, "--tls-server-name", "localhost"}, 0, ""},
		{[]string{"--tls-ca", ca.File, "--tls-server-name", "fanwire.example"}, 1, "fanwire.example"},
		{nil, 1, "certificate"},
		{[]string{"--tls-ca", filepath.Join(dir, "missing")}, 1, "--tls-ca"},
	} {
		var out, errOut bytes.Buffer
		if code := run(append([]string{"health", "--url", "https://" + listen + "/readyz"}, tc.args...), &out, &errOut); code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("health %v: exit %d (%s), want %d saying %q", tc.args, code, errOut.String(), tc.code, tc.want)
		}
	}

	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer dcancel()
	dial := func() (*websocket.Conn, string) {
		t.Helper()
		c, resp, err := websocket.Dial(dctx, "wss://"+listen+"/ws", &websocket.DialOptions{HTTPClient: client})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.CloseNow() })
		return c, resp.TLS.PeerCertificates[0].Subject.CommonName
	}
	conn, name := dial()
	if name != "gateway" {
		t.Fatalf("certificate %q", name)
	}
	if err := conn.Write(dctx, websocket.MessageText, []byte(`{"type":"subscribe","id":"s","subject":"app.>"}`)); err != nil {
		t.Fatal(err)
	}
	readUntil(t, dctx, conn, `"subscribed"`)
	// Published over https, through the secured NATS server, out over wss.
	resp, err := client.Post("https://"+listen+"/api/publish", "application/json", strings.NewReader(`{"subject":"app.1","data":"secured"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("publish: %s", resp.Status)
	}
	readUntil(t, dctx, conn, `secured`)

	// Renewed in place; looked at within the check interval (2 s).
	renewed, renewedKey := ca.Issue(t, t.TempDir(), "gateway-renewed")
	for src, dst := range map[string]string{renewed: certFile, renewedKey: keyFile} {
		if err := os.Rename(src, dst); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		c, name := dial()
		c.CloseNow()
		if name == "gateway-renewed" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("new connections still see %q after the files were replaced", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readUntil reads messages until one contains want.
func readUntil(t *testing.T, ctx context.Context, c *websocket.Conn, want string) {
	t.Helper()
	for {
		_, msg, err := c.Read(ctx)
		if err != nil {
			t.Fatalf("reading for %s: %v", want, err)
		}
		if strings.Contains(string(msg), want) {
			return
		}
	}
}

// TestSecuredBrokerRefusals: ws and ingest fail at start, exit 1, with an
// error naming the flag: a missing credentials or TLS file (before
// dialling), credentials the server refuses, an untrusted certificate, a
// half-given listener pair.
func TestSecuredBrokerRefusals(t *testing.T) {
	ca := brokertest.NewCA(t)
	ns := brokertest.NATSSecure(t, brokertest.SecureNATSConfig{CA: ca, Auth: "creds"})
	rs := brokertest.RedisSecure(t, brokertest.SecureRedisConfig{CA: ca, User: "fanwire", UserPassword: "pa55"})
	missing := filepath.Join(t.TempDir(), "missing")
	nats := []string{"--nats-url", ns.Server.ClientURL(), "--nats-tls-ca", ca.File}
	redis := []string{"--broker", "redis", "--stream", "fw"}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"creds missing", append([]string{"--nats-creds", missing}, nats...), []string{"--nats-creds", missing}},
		{"no creds", nats, []string{"Authorization Violation", "--nats-creds"}},
		{"nkey missing", append([]string{"--nats-nkey", missing}, nats...), []string{"--nats-nkey", missing}},
		{"untrusted nats certificate", []string{"--nats-url", ns.Server.ClientURL(), "--nats-creds", ns.CredsFile}, []string{"certificate", "--nats-tls-ca"}},
		{"nats client key missing", append([]string{"--nats-tls-cert", ns.ClientCert, "--nats-tls-key", missing}, nats...), []string{"--nats-tls-key", missing}},
		{"redis wrong password", append([]string{"--redis-url", "rediss://fanwire:wrong@" + rs.Addr, "--redis-tls-ca", ca.File}, redis...), []string{"WRONGPASS", "--redis-url"}},
		{"redis untrusted", append([]string{"--redis-url", "rediss://fanwire:pa55@" + rs.Addr}, redis...), []string{"certificate", "--redis-tls-ca"}},
		{"redis ca with redis://", append([]string{"--redis-url", "redis://fanwire:pa55@" + rs.Addr, "--redis-tls-ca", ca.File}, redis...), []string{"--redis-tls-ca", "rediss://"}},
	} {
		for _, role := range []string{"ws", "ingest"} {
			t.Run(tc.name+"/"+role, func(t *testing.T) {
				args := append([]string{role, "--listen", "127.0.0.1:0"}, tc.args...)
				if role == "ws" {
					args = append(args, "--allow-anonymous")
				} else {
					args = append(args, "--pg", "postgres://fanwire@127.0.0.1:1/none")
				}
				var out, errOut bytes.Buffer
				if code := run(args, &out, &errOut); code != 1 {
					t.Fatalf("exit %d, want 1: %s", code, errOut.String())
				}
				for _, w := range tc.want {
					if !strings.Contains(errOut.String(), w) {
						t.Errorf("error %q does not say %q", errOut.String(), w)
					}
				}
				if strings.Contains(errOut.String(), "pa55") {
					t.Errorf("error %q shows the password", errOut.String())
				}
			})
		}
	}
	t.Run("tls-cert without tls-key", func(t *testing.T) {
		cert, _ := ca.Issue(t, t.TempDir(), "x")
		var out, errOut bytes.Buffer
		if code := run([]string{"ws", "--listen", "127.0.0.1:0", "--allow-anonymous", "--tls-cert", cert}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "--tls-key") {
			t.Fatalf("exit %d: %s", code, errOut.String())
		}
	})
	t.Run("tls-key missing", func(t *testing.T) {
		cert, _ := ca.Issue(t, t.TempDir(), "x")
		var out, errOut bytes.Buffer
		if code := run([]string{"ws", "--listen", "127.0.0.1:0", "--allow-anonymous", "--tls-cert", cert, "--tls-key", missing}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "--tls-key") || !strings.Contains(errOut.String(), missing) {
			t.Fatalf("exit %d: %s", code, errOut.String())
		}
	})
}

// TestIngestSecured: the ingest role publishes a committed row through a
// NATS server that wants a .creds user and client certificates
// (JetStream), and through a redis-server with an ACL user and TLS with
// client certificates, given by its flags.
func TestIngestSecured(t *testing.T) {
	ca := brokertest.NewCA(t)
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			pg := pgtest.Start(t, pgtest.Config{})
			pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY, v int)")
			var args []string
			var d broker.Durable
			switch kind {
			case "jetstream":
				ns := brokertest.NATSSecure(t, brokertest.SecureNATSConfig{CA: ca, VerifyClients: true, Auth: "creds"})
				args = []string{"--broker", "jetstream", "--nats-url", ns.Server.ClientURL(), "--stream", "CDC", "--nats-creds", ns.CredsFile,
					"--nats-tls-ca", ca.File, "--nats-tls-cert", ns.ClientCert, "--nats-tls-key", ns.ClientKey}
				b, err := broker.DialJetStream(ctx, broker.JetStreamConfig{Stream: "CDC", NATSConfig: broker.NATSConfig{URL: ns.Server.ClientURL(),
					Subjects: []string{"db.>"}, CredsFile: ns.CredsFile, TLSCA: ca.File, TLSCert: ns.ClientCert, TLSKey: ns.ClientKey}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = b.Close() })
				d = b
			case "redis":
				rs := brokertest.RedisSecure(t, brokertest.SecureRedisConfig{CA: ca, VerifyClients: true, User: "fanwire", UserPassword: "pa55"})
				url := "rediss://fanwire:pa55@" + rs.Addr
				args = []string{"--broker", "redis", "--redis-url", url, "--stream", "cdc", "--redis-tls-ca", ca.File,
					"--redis-tls-cert", rs.ClientCert, "--redis-tls-key", rs.ClientKey}
				b, err := broker.DialRedis(ctx, broker.RedisConfig{URL: url, Stream: "cdc", TLSCA: ca.File, TLSCert: rs.ClientCert, TLSKey: rs.ClientKey})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = b.Close() })
				d = b
			}
			f, bf := parseIngestFlags(t, append([]string{"--pg", pg.DSN("postgres"), "--state-dir", t.TempDir()}, args...)...)
			defer runIngestInTest(t, ctx, f, bf)()
			pg.Exec("postgres", "INSERT INTO t VALUES (42, 1)")
			until := "js:1000000000"
			if kind == "redis" {
				until = "rs:99999999999999-0"
			}
			for {
				var got []string
				if err := d.Replay(ctx, []string{"db.>"}, "", until, func(ms []broker.Message) error {
					for _, m := range ms {
						got = append(got, m.Subject)
					}
					return nil
				}); err != nil {
					t.Fatal(err)
				}
				if slices.Contains(got, "db.t.42") {
					return
				}
				if ctx.Err() != nil {
					t.Fatalf("the row's event never reached the broker; it holds %v", got)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}
