package brokertest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
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

	t      testing.TB
	cmd    *exec.Cmd     // nil while stopped
	exited chan struct{} // closed when cmd has exited (its Wait returned)
}

// StartRedis starts a redis-server on port (0: a free one) with its data in
// dir (which may hold a stopped server's data), and kills it by t.Cleanup.
// A free port is picked, then bound by the server: one taken in between
// (the server says "Address already in use") is replaced by another.
func StartRedis(t testing.TB, dir string, port int) *RedisServer {
	t.Helper()
	r := &RedisServer{Dir: dir, Port: port, t: t}
	t.Cleanup(func() {
		if r.cmd != nil {
			r.Kill()
		}
	})
	if port != 0 {
		r.Start()
		return r
	}
	startOnFreePorts(t, func() error {
		r.Port = freePort(t)
		return r.start()
	})
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
	<-r.exited
	r.cmd = nil
}

// Start starts the (stopped) server again on its port with its data, and
// waits until it answers PING (that is, it has loaded its data).
func (r *RedisServer) Start() {
	r.t.Helper()
	if err := r.start(); err != nil {
		r.t.Fatalf("brokertest: %v", err)
	}
}

// start starts the server and waits until it answers PING as itself: a
// server of another test that holds the port (ours then exits) would
// answer too.
func (r *RedisServer) start() error {
	bin := redisServer(r.t)
	logFile := filepath.Join(r.Dir, "redis.log")
	cmd := exec.Command(bin, "--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1", "--dir", r.Dir,
		"--save", "", "--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no", "--logfile", logFile)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	exited := make(chan struct{})
	go func() { // owned by the server: ends when the process does (Kill waits for it)
		_ = cmd.Wait()
		close(exited)
	}()
	r.cmd, r.exited = cmd, exited
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-exited:
			r.cmd = nil
			log, _ := os.ReadFile(logFile)
			return portTaken(fmt.Errorf("redis-server on %s exited:\n%s", r.Addr(), log), string(log))
		default:
		}
		pid, err := pingPID(r.Addr())
		if err == nil && pid == cmd.Process.Pid {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("answered by process %d, not ours (%d)", pid, cmd.Process.Pid)
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logFile)
			return fmt.Errorf("redis-server not answering on %s: %v\n%s", r.Addr(), err, log)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// pingPID is ping, then the answering server's process id (INFO
// server), on one connection.
func pingPID(addr string) (int, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	br := bufio.NewReader(c)
	if err := pingOn(c, br); err != nil {
		return 0, err
	}
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0, err
	}
	head, err := br.ReadString('\n')
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(head, "$")))
	if err != nil || !strings.HasPrefix(head, "$") {
		return 0, fmt.Errorf("INFO answered %q", strings.TrimSpace(head))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(br, body); err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, errors.New("INFO server without process_id")
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
	return pingOn(c, bufio.NewReader(c))
}

// pingOn sends PING on c and reads +PONG through br.
func pingOn(c net.Conn, br *bufio.Reader) error {
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := br.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}
