package main

import (
	"bytes"
	"context"
	"flag"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

func TestMain(m *testing.M) {
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

func TestHelpDocumentsEveryFlagAndItsEnvironmentVariable(t *testing.T) {
	for _, c := range commands() {
		var out, errOut bytes.Buffer
		if code := run([]string{c.name, "--help"}, &out, &errOut); code != 0 {
			t.Fatalf("%s --help exited %d: %s", c.name, code, errOut.String())
		}
		c.fs.VisitAll(func(f *flag.Flag) {
			line := "--" + f.Name
			if !strings.Contains(out.String(), line) || !strings.Contains(out.String(), envName(f.Name)) {
				t.Errorf("fanwire %s --help does not document %s / %s", c.name, line, envName(f.Name))
			}
		})
	}
	var out bytes.Buffer
	if code := run([]string{"--help"}, &out, &out); code != 0 || !strings.Contains(out.String(), "FANWIRE_") {
		t.Errorf("fanwire --help: exit %d, output %q", code, out.String())
	}
}

func TestEnvironmentOverridesAndFlagsWin(t *testing.T) {
	t.Setenv("FANWIRE_LISTEN", "127.0.0.1:9999")
	t.Setenv("FANWIRE_MAX_SUBSCRIPTIONS", "7")
	c := wsCommand()
	if err := c.parse([]string{"--max-subscriptions", "9"}); err != nil {
		t.Fatal(err)
	}
	if got := c.fs.Lookup("listen").Value.String(); got != "127.0.0.1:9999" {
		t.Errorf("listen = %s, want the environment's 127.0.0.1:9999", got)
	}
	if got := c.fs.Lookup("max-subscriptions").Value.String(); got != "9" {
		t.Errorf("max-subscriptions = %s, want the flag's 9 over the environment's 7", got)
	}
	for name, want := range map[string]bool{"listen": true, "max-subscriptions": true, "ping-interval": false} {
		if got := c.isGiven(name); got != want {
			t.Errorf("isGiven(%q) = %v, want %v (given by the environment, the command line, neither)", name, got, want)
		}
	}

	t.Setenv("FANWIRE_PING_INTERVAL", "soon")
	err := wsCommand().parse(nil)
	if err == nil || !strings.Contains(err.Error(), "FANWIRE_PING_INTERVAL") {
		t.Errorf("bad environment value: error %v, want one naming FANWIRE_PING_INTERVAL", err)
	}
}

func TestUnknownCommandAndStrayArguments(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"frobnicate"}, &out, &out); code != 2 || !strings.Contains(out.String(), "unknown command") {
		t.Errorf("unknown command: exit %d, %q", code, out.String())
	}
	out.Reset()
	if code := run([]string{"ws", "extra"}, &out, &out); code != 2 || !strings.Contains(out.String(), "unexpected argument") {
		t.Errorf("stray argument: exit %d, %q", code, out.String())
	}
}

// TestRedisClusterWantsHashTag: with --redis-cluster (here from the
// environment) a stream key without a hash tag is refused before any
// connection, with the fix in the message.
func TestRedisClusterWantsHashTag(t *testing.T) {
	t.Setenv("FANWIRE_REDIS_CLUSTER", "true")
	var out, errOut bytes.Buffer
	code := run([]string{"ws", "--broker", "redis", "--redis-url", "redis://127.0.0.1:1", "--stream", "FANWIRE",
		"--listen", "127.0.0.1:0", "--log-level", "error", "--allow-anonymous"}, &out, &errOut)
	if code == 0 || !strings.Contains(errOut.String(), "hash tag") || !strings.Contains(errOut.String(), "{FANWIRE}") {
		t.Errorf("ws --redis-cluster --stream FANWIRE: exit %d, %q; want a failure asking for a hash tag such as {FANWIRE}", code, errOut.String())
	}
}

// TestDevShutsDownGracefullyOnSIGTERM builds the binary, runs "fanwire dev"
// on free ports, connects a client, and sends SIGTERM: the client must get
// 1001 and the process must exit 0.
func TestDevShutsDownGracefullyOnSIGTERM(t *testing.T) {
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the slow tests: make test runs them")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "fanwire")
	build := exec.Command("go", "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	httpPort, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	listen := "127.0.0.1:" + strconv.Itoa(httpPort)
	var logs bytes.Buffer
	cmd := exec.Command(bin, "dev", "--listen", listen, "--data-dir", filepath.Join(dir, "data"), "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	if !readyWithin(listen, 20*time.Second) {
		t.Fatalf("fanwire dev not ready: %s", logs.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, "ws://"+listen+"/ws", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	if _, b, err := c.Read(ctx); err != nil || !bytes.Contains(b, []byte(`"ready"`)) {
		t.Fatalf("first message %q, %v", b, err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	_, _, err = c.Read(ctx)
	if code := websocket.CloseStatus(err); code != websocket.StatusGoingAway {
		t.Fatalf("close status %v (%v), want 1001", code, err)
	}
	select {
	case err := <-exited:
		exited <- err // for the cleanup
		if err != nil {
			t.Fatalf("fanwire dev exited with %v, want 0\n%s", err, logs.String())
		}
	case <-ctx.Done():
		t.Fatal("fanwire dev did not exit after SIGTERM")
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "nats")); err != nil {
		t.Errorf("embedded NATS store not under --data-dir: %v", err)
	}
}

// TestWSWithoutAuthenticationNeedsAllowAnonymous: ws with no JWT key
// refuses to start, naming both ways out, before it connects to anything;
// a bad --anonymous-grants pattern is refused too.
func TestWSWithoutAuthenticationNeedsAllowAnonymous(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"ws", "--nats-url", "nats://127.0.0.1:1", "--listen", "127.0.0.1:0", "--log-level", "error"}, &out, &errOut)
	if code == 0 || !strings.Contains(errOut.String(), "--allow-anonymous") || !strings.Contains(errOut.String(), "--jwt-secret-file") {
		t.Errorf("ws without a key: exit %d, %q; want a failure naming --jwt-secret-file and --allow-anonymous", code, errOut.String())
	}
	errOut.Reset()
	code = run([]string{"ws", "--nats-url", "nats://127.0.0.1:1", "--allow-anonymous", "--anonymous-grants", "a.>.b", "--listen", "127.0.0.1:0", "--log-level", "error"}, &out, &errOut)
	if code == 0 || !strings.Contains(errOut.String(), "--anonymous-grants") {
		t.Errorf("bad --anonymous-grants: exit %d, %q", code, errOut.String())
	}
}

// readyWithin polls http://addr/readyz until it answers 200 (true) or
// within has passed (false).
func readyWithin(addr string, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for {
		resp, err := http.Get("http://" + addr + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}
