package main

import (
	"bytes"
	"crypto/tls"
	"flag"
	"io"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestAdminKeyFlags: the inspector is served only with --admin-key,
// FANWIRE_ADMIN_KEY or --admin-key-file, never by default (fanwire dev
// included), and then only to requests with that key.
func TestAdminKeyFlags(t *testing.T) {
	get := func(addr, key string) int {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+addr+"/admin/connections", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, dev := range []bool{false, true} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		var f wsFlags
		f.register(fs, dev)
		if d := fs.Lookup("admin-key").DefValue; d != "" {
			t.Fatalf("dev=%v: --admin-key defaults to %q, want none", dev, d)
		}
	}
	if addr := startWS(t, zap.NewNop(), "--allow-anonymous"); get(addr, "Some-Key") != http.StatusNotFound {
		t.Fatal("without --admin-key: /admin/connections is served")
	}

	file := filepath.Join(t.TempDir(), "admin")
	writeFile(t, file, "  Admin-Key-From-File-1-0123456789abcdef  \nignored\n")
	t.Run("flag", func(t *testing.T) {
		addr := startWS(t, zap.NewNop(), "--allow-anonymous", "--admin-key", "Admin-Key-Flag-2-0123456789abcdef")
		if get(addr, "") != http.StatusUnauthorized || get(addr, "Admin-Key-Flag-3-0123456789abcdef") != http.StatusUnauthorized || get(addr, "Admin-Key-Flag-2-0123456789abcdef") != http.StatusOK {
			t.Fatal("--admin-key: want 401 without or with another key, 200 with it")
		}
	})
	t.Run("env", func(t *testing.T) {
		t.Setenv("FANWIRE_ADMIN_KEY", "Admin-Key-Env-4-0123456789abcdef")
		if addr := startWS(t, zap.NewNop(), "--allow-anonymous"); get(addr, "Admin-Key-Env-4-0123456789abcdef") != http.StatusOK {
			t.Fatal("FANWIRE_ADMIN_KEY not taken")
		}
	})
	t.Run("file", func(t *testing.T) {
		addr := startWS(t, zap.NewNop(), "--allow-anonymous", "--admin-key-file", file)
		if get(addr, "Admin-Key-From-File-1-0123456789abcdef") != http.StatusOK || get(addr, "ignored") != http.StatusUnauthorized {
			t.Fatal("--admin-key-file: want its first line, trimmed, as the key")
		}
	})
	t.Run("both", func(t *testing.T) {
		var out, errOut bytes.Buffer
		code := run([]string{"ws", "--allow-anonymous", "--nats-url", "nats://127.0.0.1:1", "--listen", "127.0.0.1:0",
			"--admin-key", "Admin-Key-Both-5-0123456789abcdef", "--admin-key-file", file}, &out, &errOut)
		if code != 1 || !strings.Contains(errOut.String(), "--admin-key and --admin-key-file: give one") || strings.Contains(errOut.String(), "Admin-Key-Both-5-0123456789abcdef") {
			t.Fatalf("exit %d, stderr %q: want 1 and the conflict named, without the key", code, errOut.String())
		}
	})
	// A key under 32 characters refuses the start, before anything
	// connects, naming where it came from and its length, never the key.
	short := filepath.Join(t.TempDir(), "short")
	writeFile(t, short, "Short-Key-File-9\n")
	for _, tc := range []struct {
		name, env string
		args      []string
		want      string
	}{
		{name: "short flag", args: []string{"--admin-key", "Short-Key-Flag-6"}, want: "--admin-key (FANWIRE_ADMIN_KEY): the key has 16 characters, the inspector needs at least 32"},
		{name: "short env", env: "Short-Key-Env-7", want: "--admin-key (FANWIRE_ADMIN_KEY): the key has 15 characters, the inspector needs at least 32"},
		{name: "31 characters", args: []string{"--admin-key", strings.Repeat("k", 31)}, want: "the key has 31 characters"},
		{name: "short file", args: []string{"--admin-key-file", short}, want: "--admin-key-file " + short + ": its first line, the key has 16 characters, the inspector needs at least 32"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("FANWIRE_ADMIN_KEY", tc.env)
			}
			var out, errOut bytes.Buffer
			args := append([]string{"ws", "--allow-anonymous", "--nats-url", "nats://127.0.0.1:1", "--listen", "127.0.0.1:0"}, tc.args...)
			code := run(args, &out, &errOut)
			if code != 1 || !strings.Contains(errOut.String(), tc.want) || strings.Contains(errOut.String(), "Short-Key") || strings.Contains(errOut.String(), "kkkk") || strings.Contains(errOut.String(), "nats") {
				t.Fatalf("exit %d, stderr %q: want 1 and %q, without the key, before the broker is dialled", code, errOut.String(), tc.want)
			}
		})
	}
}

// TestAdminListen: with --admin-listen (FANWIRE_ADMIN_LISTEN) the
// inspector answers on that address only: /admin/ is 404 on --listen, the
// admin listener serves the API (401 without the key), the console's
// inspector page at / and nothing else; it is plain HTTP even when --listen
// is TLS; without a key it refuses to start; fanwire ws stops it with the
// node (startWS's cleanup waits for serveGateway to return nil).
func TestAdminListen(t *testing.T) {
	const key = "Admin-Key-Listen-0123456789abcdef"
	get := func(t *testing.T, c *http.Client, url, key string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", url, nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	t.Run("apart", func(t *testing.T) {
		admin := listenAddr(t)
		t.Setenv("FANWIRE_ADMIN_LISTEN", admin)
		core, logs := observer.New(zap.InfoLevel)
		addr := startWS(t, zap.New(core), "--allow-anonymous", "--admin-key", key)
		if st, body := get(t, http.DefaultClient, "http://"+addr+"/admin/connections", key); st != http.StatusNotFound || !strings.Contains(body, "not_found") {
			t.Fatalf("--listen: %d %s, want 404", st, body)
		}
		if st, _ := get(t, http.DefaultClient, "http://"+admin+"/admin/connections", ""); st != http.StatusUnauthorized {
			t.Fatalf("--admin-listen without the key: %d, want 401", st)
		}
		if st, body := get(t, http.DefaultClient, "http://"+admin+"/admin/connections", key); st != http.StatusOK || !strings.Contains(body, `"node_connections":0`) {
			t.Fatalf("--admin-listen: %d %s, want the list", st, body)
		}
		if st, body := get(t, http.DefaultClient, "http://"+admin+"/", ""); st != http.StatusOK || !strings.Contains(body, `<body data-page="inspector">`) {
			t.Fatalf("--admin-listen /: %d, want the inspector's page", st)
		}
		for _, path := range []string{"/ws", "/readyz", "/metrics", "/api/publish"} {
			if st, _ := get(t, http.DefaultClient, "http://"+admin+path, key); st != http.StatusNotFound {
				t.Errorf("--admin-listen %s: %d, want 404", path, st)
			}
		}
		if l := logs.FilterField(zap.String("inspector", "http://"+admin+"/admin/connections")); l.Len() != 1 {
			t.Fatalf("the start-up log does not give the inspector's address: %v", logs.All())
		}
		if l := logs.FilterMessageSnippet("not loopback or private"); l.Len() != 0 {
			t.Fatalf("a loopback --admin-listen warned: %v", l.All())
		}
	})

	t.Run("TLS on --listen, plain HTTP apart", func(t *testing.T) {
		ca := brokertest.NewCA(t)
		cert, certKey := ca.Issue(t, t.TempDir(), "gateway")
		admin := listenAddr(t)
		addr := launchWS(t, zap.NewNop(), "--allow-anonymous", "--admin-key", key, "--admin-listen", admin, "--tls-cert", cert, "--tls-key", certKey)
		tlsClient := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}}}
		t.Cleanup(tlsClient.CloseIdleConnections)
		for deadline := time.Now().Add(10 * time.Second); ; {
			resp, err := tlsClient.Get("https://" + addr + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				t.Fatalf("--listen not ready over TLS: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
		}
		if st, _ := get(t, tlsClient, "https://"+addr+"/admin/connections", key); st != http.StatusNotFound {
			t.Fatalf("--listen over TLS: /admin/connections %d, want 404", st)
		}
		if st, _ := get(t, http.DefaultClient, "http://"+admin+"/admin/connections", key); st != http.StatusOK {
			t.Fatalf("--admin-listen over plain HTTP: %d, want 200", st)
		}
	})

	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"without a key", []string{"--admin-listen", "127.0.0.1:0"}, "--admin-listen needs --admin-key or --admin-key-file"},
		{"a bad address", []string{"--admin-listen", "127.0.0.1:http-alt-nope", "--admin-key", key}, "--admin-listen: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			args := append([]string{"ws", "--allow-anonymous", "--nats-url", brokertest.NATS(t).ClientURL(), "--listen", "127.0.0.1:0", "--log-level", "error"}, tc.args...)
			if code := run(args, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), tc.want) || strings.Contains(errOut.String(), key) {
				t.Fatalf("exit %d, stderr %q: want 1 and %q", code, errOut.String(), tc.want)
			}
		})
	}

	t.Run("help", func(t *testing.T) {
		var out, errOut bytes.Buffer
		if code := run([]string{"ws", "--help"}, &out, &errOut); code != 0 {
			t.Fatalf("exit %d", code)
		}
		for _, want := range []string{"--admin-listen", "FANWIRE_ADMIN_LISTEN", "plain HTTP", "at least 32 characters", "--ip-limit-ipv6-prefix", "FANWIRE_IP_LIMIT_IPV6_PREFIX"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("fanwire ws --help does not say %q", want)
			}
		}
	})
}

func TestPrivateAddr(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1": true, "::1": true, "10.1.2.3": true, "192.168.0.9": true, "172.16.0.1": true, "fd00::7": true, "fe80::1": true,
		"::ffff:10.1.2.3": true, "0.0.0.0": false, "::": false, "203.0.113.9": false, "2001:db8::1": false,
	} {
		if got := privateAddr(netip.MustParseAddr(addr)); got != want {
			t.Errorf("privateAddr(%s) = %v, want %v", addr, got, want)
		}
	}
}
