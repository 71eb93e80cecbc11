package gateway_test

import (
	"bufio"
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/gatewaytest"
	"github.com/fanwire/fanwire/gateway/tlscert"
	"github.com/prometheus/client_golang/prometheus"
)

// The admission benchmarks measure the gateway alone: their clients run in
// a child process (TestUpgradeClientsHelper, this test binary run again),
// so the heap, goroutines and CPU read here are the gateway's.
//
//	go test -run '^$' -bench 'PreUpgrade|UpgradeRate' -benchtime 1x -count 5 ./gateway

// benchGateway starts a gateway on an embedded NATS server, over TLS when
// tlsOn (a certificate of the test's CA).
func benchGateway(b *testing.B, tlsOn bool, mutate func(*gateway.Config)) *env {
	ns := brokertest.NATS(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	br, err := broker.DialNATS(ctx, broker.NATSConfig{URL: ns.ClientURL()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = br.Close() })
	reg := prometheus.NewRegistry()
	cfg := gateway.Config{Broker: br, Registry: reg, MaxHandshakes: 8192}
	if mutate != nil {
		mutate(&cfg)
	}
	var gs *gatewaytest.Server
	if tlsOn {
		ca := brokertest.NewCA(b)
		certFile, keyFile := ca.Issue(b, b.TempDir(), "gateway")
		certs, err := tlscert.New(certFile, keyFile, 0, nil)
		if err != nil {
			b.Fatal(err)
		}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool}, DisableKeepAlives: true}}
		gs = gatewaytest.StartTLS(b, cfg, certs.TLSConfig(), client)
	} else {
		gs = gatewaytest.Start(b, cfg)
	}
	return &env{t: b, srv: gs.Gateway, http: gs.HTTP, reg: reg, stop: gs.Close}
}

// clients runs the helper process against e: mode "hold" opens n
// connections, sends each an upgrade request and holds them until release
// is called ("silent": sends nothing); mode "rate" upgrades and drops connections on n workers for d
// and then exits (wait returns what it printed).
type clients struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *bufio.Reader
}

func startClients(b *testing.B, e *env, mode string, n int, d time.Duration) *clients {
	cmd := exec.Command(os.Args[0], "-test.run=^TestUpgradeClientsHelper$")
	cmd.Env = append(os.Environ(),
		"FANWIRE_UPGRADE_HELPER="+strings.Join([]string{mode, e.http.Listener.Addr().String(), strconv.Itoa(n), d.String(), strconv.FormatBool(strings.HasPrefix(e.http.URL, "https"))}, " "))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	return &clients{cmd: cmd, stdin: stdin, out: bufio.NewReader(stdout)}
}

// line reads the helper's next line of output.
func (c *clients) line(b *testing.B) string {
	s, err := c.out.ReadString('\n')
	if err != nil {
		b.Fatalf("upgrade helper: %v", err)
	}
	return strings.TrimSpace(s)
}

// release tells the helper to close its connections and waits for it.
func (c *clients) release(b *testing.B) {
	_ = c.stdin.Close()
	_, _ = io.Copy(io.Discard, c.out)
	if err := c.cmd.Wait(); err != nil {
		b.Fatalf("upgrade helper: %v", err)
	}
}

// BenchmarkPreUpgrade: what a connection not upgraded yet costs the
// gateway: 2,000 connections that have sent nothing (silent: at most
// --max-handshakes of them), or 2,000 upgrade requests waiting for
// admission (the clock stands still, so no token comes), on plain TCP and
// over TLS.
func BenchmarkPreUpgrade(b *testing.B) {
	const n = 2000
	for _, mode := range []string{"silent", "waiting"} {
		for _, tlsOn := range []bool{false, true} {
			name := mode + "-tcp"
			if tlsOn {
				name = mode + "-tls"
			}
			b.Run(name, func(b *testing.B) { benchPreUpgrade(b, mode, n, tlsOn) })
		}
	}
}

func benchPreUpgrade(b *testing.B, mode string, n int, tlsOn bool) {
	e := benchGateway(b, tlsOn, func(c *gateway.Config) {
		c.MaxConnectRate, c.ConnectBurst, c.ConnectQueue, c.ConnectQueueWait = 1, 1, n, time.Hour
	})
	gateway.FreezeAdmission(e.srv)
	// The burst's token goes to a connection made first: every request
	// measured waits.
	first := startClients(b, e, "hold", 1, 0)
	if got := first.line(b); got != "sent" {
		b.Fatalf("upgrade helper: %q", got)
	}
	for e.metric("fanwire_connections", nil) != 1 {
		time.Sleep(10 * time.Millisecond)
	}
	defer first.release(b)
	there := func() bool { return e.metric("fanwire_connect_queue", nil) == float64(n) }
	helper := "hold"
	if mode == "silent" {
		helper = "silent"
		there = func() bool { return gateway.PendingHandshakes(e.srv) == n }
	}
	var heap, stack, goroutines float64
	for range b.N {
		before, g0 := liveMem()
		c := startClients(b, e, helper, n, 0)
		if got := c.line(b); got != "sent" {
			b.Fatalf("upgrade helper: %q", got)
		}
		for !there() {
			time.Sleep(10 * time.Millisecond)
		}
		after, g1 := liveMem()
		heap += float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / float64(n)
		stack += float64(int64(after.StackInuse)-int64(before.StackInuse)) / float64(n)
		goroutines += float64(g1-g0) / float64(n)
		c.release(b)
		for gateway.PendingHandshakes(e.srv) != 0 {
			time.Sleep(10 * time.Millisecond)
		}
	}
	b.ReportMetric(heap/float64(b.N), "heap-B/conn")
	b.ReportMetric(stack/float64(b.N), "stack-B/conn")
	b.ReportMetric(goroutines/float64(b.N), "goroutines/conn")
}

func liveMem() (runtime.MemStats, int) {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m, runtime.NumGoroutine()
}

// BenchmarkUpgradeRate: how many upgrades per second the gateway serves,
// and its CPU per upgrade, with 32 clients upgrading and dropping their
// connections for 3 s: without a connect rate (plain TCP, TLS), through
// the admission at a rate it never reaches, and under the default rate
// (whose burst is in the figure: 3 s admit up to 4 s worth).
func BenchmarkUpgradeRate(b *testing.B) {
	for _, tc := range []struct {
		name  string
		tls   bool
		limit int
	}{
		{"tcp", false, -1},
		{"tcp-admission", false, 1_000_000}, // the admission's path, never limiting: its cost
		{"tls", true, -1},
		{"tcp-default-rate", false, gateway.DefaultMaxConnectRate},
	} {
		b.Run(tc.name, func(b *testing.B) {
			e := benchGateway(b, tc.tls, func(c *gateway.Config) { c.MaxConnectRate = tc.limit })
			var rate, cpu, refused float64
			for range b.N {
				accepted0 := e.metric("fanwire_connections_accepted_total", nil)
				refused0 := e.metric("fanwire_connections_rejected_total", map[string]string{"reason": gateway.CodeConnectRate})
				cpu0 := processCPU()
				start := time.Now()
				c := startClients(b, e, "rate", 32, 3*time.Second)
				c.release(b)
				el := time.Since(start)
				accepted := e.metric("fanwire_connections_accepted_total", nil) - accepted0
				rate += accepted / el.Seconds()
				cpu += (processCPU() - cpu0).Seconds() * 1e6 / accepted
				refused += e.metric("fanwire_connections_rejected_total", map[string]string{"reason": gateway.CodeConnectRate}) - refused0
			}
			b.ReportMetric(rate/float64(b.N), "upgrades/s")
			b.ReportMetric(cpu/float64(b.N), "gateway-cpu-µs/upgrade")
			b.ReportMetric(refused/float64(b.N), "connect_rate-refusals")
		})
	}
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// drop closes c with a reset: thousands of closes a second would otherwise
// leave as many ports in TIME_WAIT.
func drop(c net.Conn) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	c.Close()
}

// TestUpgradeClientsHelper is the benchmarks' client process; run
// directly, it does nothing.
func TestUpgradeClientsHelper(t *testing.T) {
	spec := strings.Fields(os.Getenv("FANWIRE_UPGRADE_HELPER"))
	if len(spec) != 5 {
		return
	}
	mode, addr := spec[0], spec[1]
	n, _ := strconv.Atoi(spec[2])
	d, _ := time.ParseDuration(spec[3])
	tlsOn := spec[4] == "true"
	dial := func() (net.Conn, error) {
		c, err := net.Dial("tcp", addr)
		if err != nil || !tlsOn {
			return c, err
		}
		tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true})
		if err := tc.Handshake(); err != nil {
			c.Close()
			return nil, err
		}
		return tc, nil
	}
	upgrade := func(c net.Conn) error {
		var key [16]byte
		_, _ = crand.Read(key[:])
		_, err := io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: "+addr+"\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
			"Sec-WebSocket-Key: "+base64.StdEncoding.EncodeToString(key[:])+"\r\nSec-WebSocket-Version: 13\r\n\r\n")
		return err
	}
	switch mode {
	case "hold", "silent":
		conns := make([]net.Conn, 0, n)
		for range n {
			c, err := dial()
			if err != nil {
				t.Fatal(err)
			}
			if mode == "hold" {
				if err := upgrade(c); err != nil {
					t.Fatal(err)
				}
			}
			conns = append(conns, c)
		}
		fmt.Println("sent")
		_, _ = io.Copy(io.Discard, os.Stdin)
		for _, c := range conns {
			drop(c)
		}
	case "rate":
		var done atomic.Int64
		var wg sync.WaitGroup
		stop := time.Now().Add(d)
		for range n {
			wg.Go(func() {
				for time.Now().Before(stop) {
					c, err := dial()
					if err != nil {
						t.Error(err)
						return
					}
					if err := upgrade(c); err != nil {
						t.Error(err)
						c.Close()
						return
					}
					resp, err := http.ReadResponse(bufio.NewReader(c), nil)
					drop(c)
					if err != nil {
						t.Error(err)
						return
					}
					if resp.StatusCode == http.StatusSwitchingProtocols {
						done.Add(1)
					}
				}
			})
		}
		wg.Wait()
		fmt.Println(done.Load())
	}
}
