// Package brokertest starts real brokers for tests, the way net/http/httptest
// starts real HTTP servers: each on a free loopback port with its state in
// t.TempDir(), stopped by t.Cleanup. They fail the test loudly when something
// is missing; they never skip.
package brokertest

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/nats-io/nats-server/v2/server"
)

// NATS starts an embedded NATS server with JetStream and returns it; its
// ClientURL() is the URL to connect to.
func NATS(t testing.TB) *server.Server {
	t.Helper()
	ns, err := broker.StartEmbedded(broker.EmbeddedConfig{JetStream: true, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatalf("brokertest: %v", err)
	}
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	return ns
}

// RestartNATS shuts ns down and starts a new server on the same port with
// the same JetStream store, as a restarted broker; the new one is stopped
// by t.Cleanup. (The first server's cleanup is harmless on a stopped one.)
func RestartNATS(t testing.TB, ns *server.Server) *server.Server {
	t.Helper()
	port := ns.Addr().(*net.TCPAddr).Port
	dir := filepath.Dir(ns.StoreDir())
	ns.Shutdown()
	ns.WaitForShutdown()
	var err error
	for range 50 { // the port is free again once the old listener is closed
		var n *server.Server
		if n, err = broker.StartEmbedded(broker.EmbeddedConfig{Port: port, JetStream: true, StoreDir: dir}); err == nil {
			t.Cleanup(func() {
				n.Shutdown()
				n.WaitForShutdown()
			})
			return n
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("brokertest: restart NATS on port %d: %v", port, err)
	return nil
}

// Redis starts a real redis-server (from PATH) on a free loopback port with
// its files in t.TempDir(), and returns its address (host:port). It fails
// the test, with how to fix it, when redis-server is missing.
func Redis(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("brokertest: redis-server not found on PATH (run `make test`, which installs it, or apt-get install redis-server): %v", err)
	}
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("brokertest: free port: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		t.Fatalf("brokertest: start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return addr
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(dir, "redis.log"))
			t.Fatalf("brokertest: redis-server not accepting connections on %s: %v\n%s", addr, err, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
