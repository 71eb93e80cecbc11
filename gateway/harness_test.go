package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/fanwire/fanwire/broker"
	"github.com/fanwire/fanwire/broker/brokertest"
	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/gatewaytest"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
)

// env is one gateway under test: a real embedded NATS server, the gateway
// consuming it, and an HTTP server in front, all stopped by t.Cleanup.
type env struct {
	t    testing.TB
	ns   *server.Server
	nc   *nats.Conn // a separate publisher connection
	srv  *gateway.Server
	http *httptest.Server
	reg  *prometheus.Registry
	b    broker.Broker
	stop func() // shuts the gateway down gracefully (idempotent)

	redis *brokertest.RedisServer // the "redis" kind's server (nil for "redis-cluster")

	kind     string
	jsMutate func(*broker.JetStreamConfig)
}

func newEnv(t testing.TB, mutate func(*gateway.Config)) *env {
	t.Helper()
	return newEnvOn(t, "nats", mutate)
}

// newEnvOn is newEnv on a given broker kind: "nats", "jetstream", "redis"
// (one redis-server) or "redis-cluster" (a 3-node Redis Cluster).
func newEnvOn(t testing.TB, kind string, mutate func(*gateway.Config)) *env {
	t.Helper()
	return newEnvJS(t, kind, nil, mutate)
}

// newEnvJS is newEnvOn with a hook to adjust the JetStream configuration.
func newEnvJS(t testing.TB, kind string, jsMutate func(*broker.JetStreamConfig), mutate func(*gateway.Config)) *env {
	t.Helper()
	return startEnv(t, brokertest.NATS(t), kind, jsMutate, mutate)
}

// sibling starts a second gateway on the same NATS server (and so the same
// stream), as another node behind a load balancer.
func (e *env) sibling(mutate func(*gateway.Config)) *env {
	e.t.Helper()
	if e.redis != nil {
		return startEnvRedis(e.t, e.ns, e.kind, e.jsMutate, mutate, e.redis)
	}
	return startEnv(e.t, e.ns, e.kind, e.jsMutate, mutate)
}

func startEnv(t testing.TB, ns *server.Server, kind string, jsMutate func(*broker.JetStreamConfig), mutate func(*gateway.Config)) *env {
	t.Helper()
	return startEnvRedis(t, ns, kind, jsMutate, mutate, nil)
}

// startEnvRedis is startEnv whose "redis" kind uses shared (nil: a
// redis-server of its own).
func startEnvRedis(t testing.TB, ns *server.Server, kind string, jsMutate func(*broker.JetStreamConfig), mutate func(*gateway.Config), shared *brokertest.RedisServer) *env {
	t.Helper()
	return startEnvListener(t, ns, kind, jsMutate, mutate, shared, nil)
}

// startEnvListener is startEnvRedis serving through wrap(listener) (nil:
// the listener itself).
func startEnvListener(t testing.TB, ns *server.Server, kind string, jsMutate func(*broker.JetStreamConfig), mutate func(*gateway.Config), shared *brokertest.RedisServer, wrap func(net.Listener) net.Listener) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ncfg := broker.NATSConfig{URL: ns.ClientURL(), Name: "gateway-test"}
	var b broker.Broker
	var rs *brokertest.RedisServer
	var err error
	switch kind {
	case "nats":
		b, err = broker.DialNATS(ctx, ncfg)
	case "jetstream":
		ncfg.Subjects = []string{"orders.>", "app.>"}
		jcfg := broker.JetStreamConfig{NATSConfig: ncfg, Storage: "memory"}
		if jsMutate != nil {
			jsMutate(&jcfg)
		}
		b, err = broker.DialJetStream(ctx, jcfg)
	case "redis":
		rs = shared
		if rs == nil {
			rs = brokertest.StartRedis(t, t.TempDir(), 0)
		}
		b, err = broker.DialRedis(ctx, broker.RedisConfig{URL: "redis://" + rs.Addr(), Stream: "{fanwire}"})
	case "redis-cluster":
		addrs := brokertest.RedisCluster(t, 3)
		url := "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
		b, err = broker.DialRedis(ctx, broker.RedisConfig{URL: url, Cluster: true, Stream: "{fanwire}"})
	default:
		t.Fatalf("unknown broker kind %q", kind)
	}
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := gateway.Config{Broker: b, Registry: reg, Console: true}
	if mutate != nil {
		mutate(&cfg)
	}
	gs := gatewaytest.StartListener(t, cfg, wrap)
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	e := &env{t: t, ns: ns, nc: nc, srv: gs.Gateway, http: gs.HTTP, reg: reg, b: b, kind: kind, jsMutate: jsMutate, redis: rs}
	e.stop = func() {
		once.Do(func() {
			gs.Close()
			nc.Close()
			b.Close()
		})
	}
	t.Cleanup(e.stop)
	return e
}

func (e *env) wsURL() string { return "ws" + strings.TrimPrefix(e.http.URL, "http") + "/ws" }

// publish publishes raw data on subject straight into NATS and flushes.
func (e *env) publish(subject, data string) {
	e.t.Helper()
	if err := e.nc.Publish(subject, []byte(data)); err != nil {
		e.t.Fatal(err)
	}
	if err := e.nc.Flush(); err != nil {
		e.t.Fatal(err)
	}
}

// ready reports whether the gateway's /readyz answers 200.
func (e *env) ready() bool {
	resp, err := http.Get(e.http.URL + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// counter reads a counter or gauge from the gateway's registry.
func (e *env) metric(name string, labels map[string]string) float64 {
	e.t.Helper()
	mfs, err := e.reg.Gather()
	if err != nil {
		e.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	return 0
}

// client is a real WebSocket client speaking the native protocol.
type client struct {
	t    testing.TB
	c    *websocket.Conn
	msgs []map[string]any // received and not yet consumed
	raw  []string         // the same messages, verbatim
	// Native synced messages (a resume's end of catch-up) are set aside in
	// synced unless keepSynced: tests of resumes read their events, and
	// the live-view tests, which set it, read the markers in order.
	synced     []map[string]any
	keepSynced bool
	id         string // the connection's id, from its ready (dial)
}

func (e *env) dial() *client {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, _, err := websocket.Dial(ctx, e.wsURL(), nil)
	if err != nil {
		e.t.Fatal(err)
	}
	c.SetReadLimit(64 << 20)
	cl := &client{t: e.t, c: c}
	e.t.Cleanup(func() { _ = c.CloseNow() })
	ready := cl.next()
	if ready["type"] != "ready" || ready["connection_id"] == "" {
		e.t.Fatalf("first message %v, want ready with a connection_id", ready)
	}
	cl.id, _ = ready["connection_id"].(string)
	return cl
}

func (cl *client) send(v string) {
	cl.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := cl.c.Write(ctx, websocket.MessageText, []byte(v)); err != nil {
		cl.t.Fatal(err)
	}
}

// readFrame reads one frame and queues its messages; it returns the read
// error (a close, a timeout).
func (cl *client) readFrame(d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	typ, b, err := cl.c.Read(ctx)
	if err != nil {
		return err
	}
	if typ != websocket.MessageText {
		cl.t.Fatalf("server sent a %v frame", typ)
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		var m map[string]any
		if err := json.Unmarshal(line, &m); err != nil {
			cl.t.Fatalf("server message is not JSON: %q: %v", line, err)
		}
		if m["type"] == "synced" && !cl.keepSynced {
			cl.synced = append(cl.synced, m)
			continue
		}
		cl.msgs = append(cl.msgs, m)
		cl.raw = append(cl.raw, string(line))
	}
	return nil
}

// pop returns the next message, decoded and verbatim, waiting up to 5 s.
func (cl *client) pop() (map[string]any, string) {
	cl.t.Helper()
	return cl.popWithin(5 * time.Second)
}

// popWithin is pop waiting up to d.
func (cl *client) popWithin(d time.Duration) (map[string]any, string) {
	cl.t.Helper()
	for len(cl.msgs) == 0 {
		if err := cl.readFrame(d); err != nil {
			cl.t.Fatalf("waiting for a message: %v", err)
		}
	}
	m, r := cl.msgs[0], cl.raw[0]
	cl.msgs, cl.raw = cl.msgs[1:], cl.raw[1:]
	return m, r
}

// next returns the next message.
func (cl *client) next() map[string]any {
	cl.t.Helper()
	m, _ := cl.pop()
	return m
}

// nextWithin returns the next message, waiting up to d: across a broker
// failover, which takes longer than pop's 5 s.
func (cl *client) nextWithin(d time.Duration) map[string]any {
	cl.t.Helper()
	m, _ := cl.popWithin(d)
	return m
}

// nextRaw returns the next message verbatim.
func (cl *client) nextRaw() string {
	cl.t.Helper()
	_, r := cl.pop()
	return r
}

// expect reads the next message and checks the given fields.
func (cl *client) expect(want map[string]any) map[string]any {
	cl.t.Helper()
	m := cl.next()
	for k, v := range want {
		if !jsonEqual(m[k], v) {
			cl.t.Fatalf("message %v: field %q = %v, want %v", m, k, m[k], v)
		}
	}
	return m
}

// quiet asserts that nothing is queued for the client: a ping's pong must
// be the next message. (A read deadline would close the connection: the
// websocket library closes it when a read's context expires.)
func (cl *client) quiet() {
	cl.t.Helper()
	cl.send(`{"type":"ping"}`)
	if m := cl.next(); m["type"] != "pong" {
		cl.t.Fatalf("unexpected message %v", m)
	}
}

// subscribe subscribes and waits for the confirmation.
func (cl *client) subscribe(id, subject string) {
	cl.t.Helper()
	cl.send(`{"type":"subscribe","id":"` + id + `","subject":"` + subject + `"}`)
	cl.expect(map[string]any{"type": "subscribed", "id": id})
}

// closeStatus reads until the connection ends and returns its close code.
func (cl *client) closeStatus(d time.Duration) websocket.StatusCode {
	cl.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		err := cl.readFrame(time.Until(deadline))
		if err != nil {
			return websocket.CloseStatus(err)
		}
	}
	cl.t.Fatalf("connection still open after %v", d)
	return 0
}

func jsonEqual(a, b any) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return bytes.Equal(ja, jb)
}

// waitFor polls cond until it holds or 10 s pass.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

func jsonDecode(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }
