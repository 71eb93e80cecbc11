package main

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/cdc/pgtest"
	"github.com/nats-io/nats-server/v2/server"
)

// TestSecretsNeverPrinted starts each role of the built binary with
// credentials in every form it takes them (URLs with and without a
// scheme, unparsable ones, a NATS token, a keyword DSN, FANWIRE_*
// variables, API keys, a JWT secret), against servers that refuse the
// connection and against real ones (NATS with a user and password, Redis
// with requirepass, PostgreSQL), and fetches /debug/pprof/cmdline: no
// secret may appear, as given, URL-encoded or decoded, in anything the
// process writes or the debug listener serves.
func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel() // a process-level test that mostly waits: beside the others (make test's time)
	bin := buildBinary(t)
	ns := natsWithPassword(t, "fanwire", "Nats-Pass-Right7")
	rs := brokertest.RedisSecure(t, brokertest.SecureRedisConfig{Password: "Redis/Pass#Right8"})
	pg := pgtest.Start(t, pgtest.Config{})
	pg.Exec("postgres", "CREATE TABLE t (id int PRIMARY KEY)")
	dir := t.TempDir()
	jwtFile := filepath.Join(dir, "jwt")
	writeFile(t, jwtFile, "Jwt-Secret-0123456789-abcdefghijklmnop\n")
	adminFile := filepath.Join(dir, "admin")
	writeFile(t, adminFile, "Admin-Key-File-28-0123456789abcdef\n")
	keysFile := filepath.Join(dir, "keys")
	writeFile(t, keysFile, "pub Api-Key-From-File-44 app.>\n")
	natsHost := strings.TrimPrefix(ns.ClientURL(), "nats://")
	pgURL := func(pass string) string {
		return fmt.Sprintf("postgres://postgres:%s@127.0.0.1:%d/postgres?sslmode=disable", pass, pg.Port())
	}
	refused := "127.0.0.1:1"

	type run struct {
		name    string
		args    []string
		env     []string
		secrets []string
		// ready: the process keeps running; wait for this in its output
		// ("/readyz": until --listen answers it), then SIGTERM it.
		// "": it must exit on its own (a start-up error).
		ready string
	}
	ws := func(args ...string) []string {
		return append([]string{"ws", "--allow-anonymous", "--listen", "127.0.0.1:0", "--log-level", "debug"}, args...)
	}
	ingest := func(args ...string) []string {
		return append([]string{"ingest", "--listen", "127.0.0.1:0", "--log-level", "debug", "--state-dir", t.TempDir()}, args...)
	}
	runs := []run{
		// Refused or unparsable.
		{name: "ws nats url without scheme", args: ws("--nats-url", "admin:Nats-NoScheme-1@"+refused), secrets: []string{"Nats-NoScheme-1"}},
		{name: "ws nats url unparsable", args: ws("--nats-url", "nats://admin:Nats/Bad#Pass2@"+refused), secrets: []string{"Nats/Bad#Pass2"}},
		{name: "ws nats token from env", args: ws(), env: []string{"FANWIRE_NATS_URL=nats://Nats-Token-3@" + refused}, secrets: []string{"Nats-Token-3"}},
		{name: "ws nats list", args: ws("--nats-url", "nats://a:Nats-List-4a@"+refused+",b:Nats-List-4b@"+refused), secrets: []string{"Nats-List-4a", "Nats-List-4b"}},
		{name: "ws redis unparsable", args: ws("--broker", "redis", "--redis-url", "redis://:Redis/Pass%x5@"+refused), secrets: []string{"Redis/Pass%x5"}},
		{name: "ws redis refused from env", args: ws("--broker", "redis"), env: []string{"FANWIRE_REDIS_URL=redis://u:Redis-Env-6@" + refused}, secrets: []string{"Redis-Env-6"}},
		{name: "ws redis cluster unparsable", args: ws("--broker", "redis", "--redis-cluster", "--stream", "{fw}", "--redis-url", "redis://:Redis/Cluster%x7@"+refused), secrets: []string{"Redis/Cluster%x7"}},
		{name: "ingest pg url", args: ingest("--nats-url", "nats://fanwire:Nats-Pass-Right7@"+natsHost, "--pg", "postgres://u:Pg-Url-8@"+refused+"/db"), secrets: []string{"Pg-Url-8", "Nats-Pass-Right7"}, ready: "reconnecting"},
		{name: "ingest pg keyword dsn", args: ingest("--nats-url", "nats://fanwire:Nats-Pass-Right7@"+natsHost), env: []string{"FANWIRE_PG=host=127.0.0.1 port=1 user=u password='Pg Keyword 9'"}, secrets: []string{"Pg Keyword 9", "Nats-Pass-Right7"}, ready: "reconnecting"},
		{name: "ingest pg unparsable", args: ingest("--nats-url", "nats://fanwire:Nats-Pass-Right7@"+natsHost, "--pg", "postgres://u:Pg%zz/Bad10@"+refused+"/db"), secrets: []string{"Pg%zz/Bad10", "Nats-Pass-Right7"}},
		{name: "ingest nats refused", args: ingest("--nats-url", "fanwire:Nats-Ingest-11@"+refused, "--pg", pgURL("Pg-Url-12")), secrets: []string{"Nats-Ingest-11", "Pg-Url-12"}},
		{name: "loadtest nats refused", args: []string{"loadtest", "--url", "ws://" + refused + "/ws", "--nats", "lt:Loadtest-Nats-13@" + refused, "--events", "1", "--clients", "1"}, secrets: []string{"Loadtest-Nats-13"}},
		{name: "loadtest redis refused", args: []string{"loadtest", "--url", "ws://" + refused + "/ws", "--nats", "nats://" + refused, "--broker", "redis", "--redis", "redis://:Loadtest-Redis-14@" + refused, "--events", "1", "--clients", "1"}, secrets: []string{"Loadtest-Redis-14"}},
		{name: "ws help with secrets in env", args: []string{"ws", "--help"}, env: []string{"FANWIRE_API_KEY=Api-Key-Env-15", "FANWIRE_NATS_URL=nats://u:Nats-Env-16@h:1"}, secrets: []string{"Api-Key-Env-15", "Nats-Env-16"}},

		// Reachable servers refusing the credentials.
		{name: "ws nats wrong password", args: ws("--nats-url", "nats://fanwire:Nats-Wrong-17@"+natsHost), secrets: []string{"Nats-Wrong-17"}},
		{name: "ws nats wrong password without scheme", args: ws("--nats-url", "fanwire:Nats-Wrong-18@"+natsHost), secrets: []string{"Nats-Wrong-18"}},
		{name: "ws redis wrong password", args: ws("--broker", "redis", "--redis-url", "redis://:Redis-Wrong-19@"+rs.Addr), secrets: []string{"Redis-Wrong-19"}},
		{name: "ingest pg unknown user", args: ingest("--nats-url", "nats://fanwire:Nats-Pass-Right7@"+natsHost, "--pg", fmt.Sprintf("postgres://nobody:Pg-Wrong-20@127.0.0.1:%d/postgres", pg.Port())), secrets: []string{"Pg-Wrong-20", "Nats-Pass-Right7"}, ready: "reconnecting"},

		// Reachable servers taking them: the roles run, and serve
		// /debug/pprof without the command line.
		{name: "ws nats and keys", args: ws("--nats-url", "nats://fanwire:Nats-Pass-Right7@"+natsHost, "--api-key", "Api-Key-Flag-21", "--api-keys-file", keysFile, "--jwt-secret-file", jwtFile, "--admin-key", "Admin-Key-Flag-26-0123456789abcdef"),
			secrets: []string{"Nats-Pass-Right7", "Api-Key-Flag-21", "Api-Key-From-File-44", "Jwt-Secret-0123456789-abcdefghijklmnop", "Admin-Key-Flag-26-0123456789abcdef"}, ready: "/readyz"},
		{name: "ws redis from env", args: ws("--broker", "redis", "--stream", "fw-secrets"), env: []string{"FANWIRE_REDIS_URL=redis://:" + url.QueryEscape("Redis/Pass#Right8") + "@" + rs.Addr, "FANWIRE_API_KEY=Api-Key-Env-22", "FANWIRE_ADMIN_KEY=Admin-Key-Env-27-0123456789abcdef"},
			secrets: []string{"Redis/Pass#Right8", "Api-Key-Env-22", "Admin-Key-Env-27-0123456789abcdef"}, ready: "/readyz"},
		{name: "ws admin key file", args: ws("--nats-url", "nats://fanwire:Nats-Pass-Right7@"+natsHost, "--admin-key-file", adminFile),
			secrets: []string{"Nats-Pass-Right7", "Admin-Key-File-28-0123456789abcdef"}, ready: "/readyz"},
		{name: "ingest pg and nats", args: ingest("--nats-url", "fanwire:Nats-Pass-Right7@"+natsHost, "--pg", pgURL("Pg-Trusted-23")), secrets: []string{"Nats-Pass-Right7", "Pg-Trusted-23"}, ready: "/readyz"},
		{name: "dev pg and api key", args: []string{"dev", "--listen", "127.0.0.1:0", "--log-level", "debug", "--data-dir", t.TempDir(), "--state-dir", t.TempDir(), "--pg", pgURL("Pg-Dev-24"), "--api-key", "Api-Key-Dev-25"},
			secrets: []string{"Pg-Dev-24", "Api-Key-Dev-25"}, ready: "/readyz"},
	}
	for _, r := range runs {
		t.Run(r.name, func(t *testing.T) {
			args := r.args
			var listen, debug string
			if r.ready == "/readyz" {
				listen, debug = listenAddr(t), listenAddr(t)
				args = append(append([]string{}, args...), "--listen", listen, "--debug-listen", debug)
			}
			cmd := exec.Command(bin, args...)
			cmd.Env = append(os.Environ(), r.env...)
			var logs procLogs
			w := lockedWriter{mu: &logs.mu, w: &logs.buf}
			cmd.Stdout, cmd.Stderr = w, w
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }()
			t.Cleanup(func() {
				_ = cmd.Process.Kill()
				<-exited
			})
			var served string
			switch r.ready {
			case "":
				select {
				case <-exited:
					close(exited)
				case <-time.After(30 * time.Second):
					t.Fatalf("still running after 30s:\n%s", logs.dump())
				}
			default:
				deadline := time.Now().Add(30 * time.Second)
				for {
					if r.ready == "/readyz" && readyWithin(listen, 0) || r.ready != "/readyz" && strings.Contains(logs.dump(), r.ready) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("not ready (%s) within 30s:\n%s", r.ready, logs.dump())
					}
					time.Sleep(20 * time.Millisecond)
				}
				if debug != "" {
					served = fetchCmdline(t, debug)
				}
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
					close(exited)
				case <-time.After(30 * time.Second):
					t.Fatalf("did not stop on SIGTERM:\n%s", logs.dump())
				}
			}
			out := logs.dump()
			if strings.TrimSpace(out) == "" {
				t.Fatal("the process wrote nothing: nothing was checked")
			}
			for _, s := range r.secrets {
				for _, form := range secretForms(s) {
					if strings.Contains(out, form) {
						t.Errorf("the output shows secret %q (as %q):\n%s", s, form, grepLines(out, form))
					}
					if strings.Contains(served, form) {
						t.Errorf("/debug/pprof/cmdline shows secret %q (as %q): %q", s, form, served)
					}
				}
			}
		})
	}
}

// fetchCmdline GETs /debug/pprof/cmdline on the debug listener: it must
// not be served, and the index must still be.
func fetchCmdline(t *testing.T, debug string) string {
	t.Helper()
	resp, err := http.Get("http://" + debug + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("/debug/pprof/cmdline: %s, want 404", resp.Status)
	}
	resp, err = http.Get("http://" + debug + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("/debug/pprof/goroutine: %s, want 200", resp.Status)
	}
	return string(body)
}

// secretForms are the ways a secret could be printed: as given, URL
// encoded and decoded.
func secretForms(s string) []string {
	forms := []string{s, url.QueryEscape(s), url.PathEscape(s)}
	if d, err := url.PathUnescape(s); err == nil {
		forms = append(forms, d)
	}
	slices.Sort(forms)
	return slices.Compact(forms)
}

// natsWithPassword starts an embedded NATS server (JetStream on) with
// one user and password.
func natsWithPassword(t *testing.T, user, pass string) *server.Server {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(),
		NoSigs: true, Username: user, Password: pass})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats not ready")
	}
	return ns
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}
