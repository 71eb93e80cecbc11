package brokertest

import (
	"bufio"
	"context"
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

// RedisCluster starts a real Redis Cluster of n primaries (no replicas;
// Redis wants at least 3): n redis-server processes with cluster mode on and
// their files in t.TempDir(), joined by `redis-cli --cluster create`. It
// returns once every node reports cluster_state:ok, with the nodes'
// addresses (host:port), and kills them all by t.Cleanup. It fails the test,
// with how to fix it, when redis-server or redis-cli is missing.
func RedisCluster(t testing.TB, n int) []string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the tests that start a Redis cluster: make test runs them")
	}
	if n < 3 {
		t.Fatalf("brokertest: RedisCluster(%d): redis-cli --cluster create wants at least 3 primaries", n)
	}
	server := redisServer(t)
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatalf("brokertest: redis-cli not found on PATH (apt-get install redis-tools): %v", err)
	}
	dir := t.TempDir()
	ports := clusterPorts(t, n)
	addrs := make([]string, n)
	for i, port := range ports {
		addrs[i] = "127.0.0.1:" + strconv.Itoa(port)
		p := strconv.Itoa(port)
		// No persistence: a test cluster lives as long as its test.
		cmd := exec.Command(server, "--port", p, "--bind", "127.0.0.1", "--dir", dir,
			"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(dir, "nodes-"+p+".conf"),
			"--appendonly", "no", "--save", "", "--daemonize", "no", "--logfile", filepath.Join(dir, "redis-"+p+".log"))
		if err := cmd.Start(); err != nil {
			t.Fatalf("brokertest: start redis-server on %s: %v", addrs[i], err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	logs := func() string {
		var b strings.Builder
		for _, p := range ports {
			l, _ := os.ReadFile(filepath.Join(dir, "redis-"+strconv.Itoa(p)+".log"))
			fmt.Fprintf(&b, "--- redis-%d.log\n%s", p, l)
		}
		return b.String()
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range addrs {
		for ping(a) != nil {
			if time.Now().After(deadline) {
				t.Fatalf("brokertest: redis-server not answering on %s\n%s", a, logs())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	args := append([]string{"--cluster", "create"}, addrs...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("brokertest: redis-cli %s: %v\n%s\n%s", strings.Join(args, " "), err, out, logs())
	}
	// create returns once the slots are assigned; the nodes agree on the
	// map a moment later, through the cluster bus. Until a node says ok it
	// refuses commands with CLUSTERDOWN.
	for _, a := range addrs {
		for {
			info, err := clusterInfo(a)
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("brokertest: Redis Cluster node %s not ok: %v\n%s\n%s", a, err, info, logs())
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return addrs
}

// clusterPorts returns n distinct loopback ports that were free a moment
// ago together with their cluster bus ports (port+10000, which a cluster
// node also listens on).
func clusterPorts(t testing.TB, n int) []int {
	t.Helper()
	taken := map[int]bool{}
	var ports []int
	for tries := 0; len(ports) < n; tries++ {
		if tries > 1000 {
			t.Fatalf("brokertest: no %d free port pairs (port, port+10000) on 127.0.0.1", n)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("brokertest: free port: %v", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		if p+10000 > 65535 || taken[p] || taken[p+10000] {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p+10000))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		taken[p], taken[p+10000] = true, true
		ports = append(ports, p)
	}
	return ports
}

// clusterInfo sends CLUSTER INFO on a new connection and returns the text
// of its reply (a bulk string).
func clusterInfo(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("CLUSTER INFO\r\n")); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	size, ok := strings.CutPrefix(strings.TrimSpace(line), "$")
	if !ok {
		return "", fmt.Errorf("CLUSTER INFO answered %q", strings.TrimSpace(line))
	}
	n, err := strconv.Atoi(size)
	if err != nil || n < 0 {
		return "", fmt.Errorf("CLUSTER INFO answered %q", strings.TrimSpace(line))
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return "", err
	}
	return string(body), nil
}
