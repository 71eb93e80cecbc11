package brokertest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Redis starts a real redis-server (from PATH) on a free loopback port with
// its files in t.TempDir(), and returns its address (host:port). It fails
// the test, with how to fix it, when redis-server is missing.
func Redis(t testing.TB) string {
	t.Helper()
	return StartRedis(t, t.TempDir(), 0).Addr()
}

// RedisServer is a real redis-server that keeps its data in an append-only
// file in Dir, written and fsynced before each reply (appendfsync always):
// killed, it loses nothing it acknowledged, and started again on Dir it has
// it all, as a production Redis with persistence does. Its methods are for
// the test's goroutine.
type RedisServer struct {
	Dir  string // static
	Port int    // static

	t   testing.TB
	cmd *exec.Cmd // nil while stopped
}

// StartRedis starts a redis-server on port (0: a free one) with its data in
// dir (which may hold a stopped server's data), and kills it by t.Cleanup.
func StartRedis(t testing.TB, dir string, port int) *RedisServer {
	t.Helper()
	if port == 0 {
		port = freePort(t)
	}
	r := &RedisServer{Dir: dir, Port: port, t: t}
	t.Cleanup(func() {
		if r.cmd != nil {
			r.Kill()
		}
	})
	r.Start()
	return r
}

// Addr is the server's host:port.
func (r *RedisServer) Addr() string { return "127.0.0.1:" + strconv.Itoa(r.Port) }

// PID is the running server's process id.
func (r *RedisServer) PID() int {
	r.t.Helper()
	if r.cmd == nil {
		r.t.Fatal("brokertest: redis-server is not running")
	}
	return r.cmd.Process.Pid
}

// Kill kills the server with SIGKILL, as a crash, and waits for it to exit.
func (r *RedisServer) Kill() {
	r.t.Helper()
	if r.cmd == nil {
		r.t.Fatal("brokertest: redis-server is not running")
	}
	_ = r.cmd.Process.Kill()
	_ = r.cmd.Wait()
	r.cmd = nil
}

// Start starts the (stopped) server again on its port with its data, and
// waits until it answers PING (that is, it has loaded its data).
func (r *RedisServer) Start() {
	r.t.Helper()
	bin := redisServer(r.t)
	logFile := filepath.Join(r.Dir, "redis.log")
	r.cmd = exec.Command(bin, "--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1", "--dir", r.Dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no", "--logfile", logFile)
	if err := r.cmd.Start(); err != nil {
		r.cmd = nil
		r.t.Fatalf("brokertest: start redis-server: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := ping(r.Addr())
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile)
			r.t.Fatalf("brokertest: redis-server not answering on %s: %v\n%s", r.Addr(), err, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// redisServer finds redis-server on PATH, or fails the test saying how to
// install it.
func redisServer(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatalf("brokertest: redis-server not found on PATH (run `make test`, which installs it, or apt-get install redis-server): %v", err)
	}
	return bin
}

// ping sends PING on a new connection and expects +PONG: a server still
// loading its data answers -LOADING instead.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}
