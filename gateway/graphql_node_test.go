package gateway_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fanwire/fanwire/gateway"
	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/golang-jwt/jwt/v5"
)

// /graphql is tested here with real third-party clients: the npm graphql-ws
// client (over the npm ws WebSocket) run by Node from the fixture in
// testdata/graphqlws (client.mjs), and the same package's UMD build in a real
// Chromium (graphql_browser_test.go). The npm package speaks only
// graphql-transport-ws; the legacy protocol is tested in Go.

// graphqlFixture is the npm fixture: package.json, package-lock.json and the
// scripts; its node_modules is installed by `make deps` (npm ci).
const graphqlFixture = "testdata/graphqlws"

const (
	// nodeStepTimeout bounds each wait for a line from a Node client.
	nodeStepTimeout = 10 * time.Second
	// nodeExitTimeout bounds a Node client's exit once its stdin is closed.
	nodeExitTimeout = 5 * time.Second
)

// requireGraphQLFixture fails the test unless node and the fixture's
// node_modules are there: skipping would let CI pass without ever running a
// real client. It returns node's path.
func requireGraphQLFixture(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short (make test-quick) leaves out the tests that start Node: make test runs them")
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatal("node not found on PATH: run `make test`, which installs Node and npm (Debian: apt-get install nodejs npm) and the npm fixture")
	}
	requireGraphQLModules(t)
	return node
}

// requireGraphQLModules fails the test unless the npm fixture is installed.
func requireGraphQLModules(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(graphqlFixture, "node_modules", "graphql-ws", "umd", "graphql-ws.min.js")); err != nil {
		t.Fatalf("gateway/%s/node_modules is missing (%v): run `make test`, which installs it "+
			"(or: npm ci --prefix gateway/%s --no-audit --no-fund)", graphqlFixture, err, graphqlFixture)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// nodeClient is one `node client.mjs` process: one graphql-ws client, one
// WebSocket connection to the gateway. Commands go to its stdin, what it
// sees comes back as JSON lines on its stdout.
type nodeClient struct {
	t      *testing.T
	stdin  io.WriteCloser
	lines  chan string // stdout, line by line; closed at EOF
	stderr *syncBuffer
	done   chan struct{} // closed once the process has been waited for
	err    error         // the process's exit, set before done is closed
	seen   []string      // every line read, for failure messages
}

// startNode runs client.mjs against e's /graphql and waits until the client
// is connected (connection_ack received). Its cleanup closes stdin, on which
// the client disposes of itself and exits, and waits for the process.
func startNode(t *testing.T, e *env) *nodeClient {
	t.Helper()
	return startNodeWithTokens(t, e, nil)
}

// startNodeWithTokens is startNode with a token for each connection
// attempt, renewing the connection when it closes (client.mjs).
func startNodeWithTokens(t *testing.T, e *env, tokens []string) *nodeClient {
	t.Helper()
	node := requireGraphQLFixture(t)
	url := "ws" + strings.TrimPrefix(e.http.URL, "http") + "/graphql"
	cmd := exec.Command(node, "client.mjs", url)
	cmd.Dir = graphqlFixture
	if tokens != nil {
		b, err := json.Marshal(tokens)
		if err != nil {
			t.Fatal(err)
		}
		cmd.Env = append(os.Environ(), "FANWIRE_TOKENS="+string(b))
	}
	nc := &nodeClient{t: t, lines: make(chan string, 1024), stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = nc.stderr
	var err error
	if nc.stdin, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting node: %v", err)
	}
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			nc.lines <- sc.Text()
		}
		close(nc.lines)
		nc.err = cmd.Wait() // after every read from stdout
		close(nc.done)
	}()
	t.Cleanup(func() {
		_ = nc.stdin.Close()
		select {
		case <-nc.done:
		case <-time.After(nodeExitTimeout):
			_ = cmd.Process.Kill()
			<-nc.done
			t.Errorf("node client did not exit within %v of its stdin closing; stderr:\n%s", nodeExitTimeout, nc.stderr)
			return
		}
		if nc.err != nil {
			t.Errorf("node client: %v; stderr:\n%s", nc.err, nc.stderr)
		}
	})
	nc.expect(`{"connected":true}`)
	return nc
}

// send writes one command.
func (nc *nodeClient) send(cmd map[string]any) {
	nc.t.Helper()
	b, err := json.Marshal(cmd)
	if err != nil {
		nc.t.Fatal(err)
	}
	if _, err := nc.stdin.Write(append(b, '\n')); err != nil {
		nc.t.Fatalf("writing to node: %v; stderr:\n%s", err, nc.stderr)
	}
}

// subscribe starts an operation (a subscription or a query) under key.
func (nc *nodeClient) subscribe(key, query string, variables map[string]any) {
	nc.t.Helper()
	cmd := map[string]any{"cmd": "subscribe", "key": key, "query": query}
	if variables != nil {
		cmd["variables"] = variables
	}
	nc.send(cmd)
}

// next returns the next line the client printed, waiting up to nodeStepTimeout.
func (nc *nodeClient) next() string {
	nc.t.Helper()
	select {
	case line, ok := <-nc.lines:
		if !ok {
			<-nc.done
			nc.t.Fatalf("node client exited (%v) after printing:\n%s\nstderr:\n%s", nc.err, strings.Join(nc.seen, "\n"), nc.stderr)
		}
		nc.seen = append(nc.seen, line)
		return line
	case <-time.After(nodeStepTimeout):
		nc.t.Fatalf("no line from the node client within %v; it printed:\n%s\nstderr:\n%s", nodeStepTimeout, strings.Join(nc.seen, "\n"), nc.stderr)
		return ""
	}
}

// expect reads the next line and checks it byte for byte.
func (nc *nodeClient) expect(want string) {
	nc.t.Helper()
	if got := nc.next(); got != want {
		nc.t.Fatalf("node client printed\n got %s\nwant %s", got, want)
	}
}

// gqlEventLine is what client.mjs prints for an events next message of the
// selection { subject cursor data }; cursor "" is null (NATS Core).
func gqlEventLine(key, subject, cursor, data string) string {
	c := "null"
	if cursor != "" {
		c = `"` + cursor + `"`
	}
	return `{"key":"` + key + `","next":{"data":{"events":{"subject":"` + subject + `","cursor":` + c + `,"data":` + data + `}}}}`
}

// gqlErrorLine is what client.mjs prints for an error message carrying one
// GraphQL error with extensions.code.
func gqlErrorLine(key, code, message string) string {
	var m bytes.Buffer
	enc := json.NewEncoder(&m)
	enc.SetEscapeHTML(false) // as JSON.stringify
	_ = enc.Encode(message)
	return `{"key":"` + key + `","error":{"errors":[{"message":` + strings.TrimSuffix(m.String(), "\n") + `,"extensions":{"code":"` + code + `"}}]}}`
}

const nodeEventsQuery = `subscription Events($s: String!, $from: String) { events(subject: $s, from: $from) { subject cursor data } }`

// pubEvent is one event for publishAPI.
type pubEvent struct {
	subject, data string
}

// publishAPI publishes events in one POST /api/publish and returns their
// cursors (nil on NATS Core, which has none).
func (e *env) publishAPI(events ...pubEvent) []string {
	e.t.Helper()
	var body strings.Builder
	body.WriteString("[")
	for i, ev := range events {
		if i > 0 {
			body.WriteString(",")
		}
		fmt.Fprintf(&body, `{"subject":%q,"data":%s}`, ev.subject, ev.data)
	}
	body.WriteString("]")
	resp, err := http.Post(e.http.URL+"/api/publish", "application/json", strings.NewReader(body.String()))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	var pub struct {
		Published int      `json:"published"`
		Cursors   []string `json:"cursors"`
	}
	if err := jsonDecode(resp.Body, &pub); err != nil || resp.StatusCode != http.StatusOK || pub.Published != len(events) {
		e.t.Fatalf("publish %s: %d %+v %v", body.String(), resp.StatusCode, pub, err)
	}
	if e.kind != "nats" && len(pub.Cursors) != len(events) {
		e.t.Fatalf("publish on %s: cursors %v, want %d", e.kind, pub.Cursors, len(events))
	}
	return pub.Cursors
}

// cursorAt is cursors[i], or "" when the broker gives none.
func cursorAt(cursors []string, i int) string {
	if cursors == nil {
		return ""
	}
	return cursors[i]
}

func (e *env) waitSubscriptions(n float64) {
	e.t.Helper()
	waitFor(e.t, fmt.Sprintf("fanwire_subscriptions == %v", n), func() bool { return e.metric("fanwire_subscriptions", nil) == n })
}

var graphqlNodeKinds = []string{"nats", "jetstream", "redis"}

// nodeOnEveryBroker runs test as a subtest per broker kind, with a gateway
// on it (graphqlNodeEnv) and the npm client connected to it.
func nodeOnEveryBroker(t *testing.T, test func(t *testing.T, e *env, nc *nodeClient)) {
	requireGraphQLFixture(t) // before any broker starts: fail fast
	for _, kind := range graphqlNodeKinds {
		t.Run(kind, func(t *testing.T) {
			e := graphqlNodeEnv(t, kind)
			test(t, e, startNode(t, e))
		})
	}
}

func graphqlNodeEnv(t *testing.T, kind string) *env {
	return newEnvOn(t, kind, func(c *gateway.Config) {
		c.Subjects = []string{"orders.>", "app.>"}
		c.AllowAnonymousPublish = true // publishAPI publishes without a key
	})
}

// TestGraphQLNodeSubscribeComplete: the npm client subscribes, receives the
// matching events of a publish in order, with their exact subject, cursor and
// data, then unsubscribes (complete): the gateway drops the subscription
// while the connection stays open, and no further event reaches it.
func TestGraphQLNodeSubscribeComplete(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	nodeOnEveryBroker(t, func(t *testing.T, e *env, nc *nodeClient) {
		if n := e.metric("fanwire_connections", nil); n != 1 {
			t.Fatalf("fanwire_connections = %v with the client connected, want 1", n)
		}
		nc.subscribe("a", nodeEventsQuery, map[string]any{"s": "app.>"})
		e.waitSubscriptions(1)

		events := []pubEvent{
			{"orders.1", `{"n":0}`}, // outside app.>: not delivered
			{"app.x", `{"n":1,"s":"<&> é"}`},
			{"app.y.z", `[1,2.5,null,true]`},
			{"app.x", `"three"`},
			{"orders.2", `{"n":-1}`},
			{"app.w", `{"n":4,"nested":{"k":[{}]}}`},
			{"app.x", `5`},
		}
		cursors := e.publishAPI(events...)
		for i, ev := range events {
			if strings.HasPrefix(ev.subject, "app.") {
				nc.expect(gqlEventLine("a", ev.subject, cursorAt(cursors, i), ev.data))
			}
		}

		nc.send(map[string]any{"cmd": "unsubscribe", "key": "a"})
		nc.expect(`{"unsubscribed":"a"}`)
		nc.expect(`{"key":"a","complete":true}`)
		e.waitSubscriptions(0)
		if n := e.metric("fanwire_connections", nil); n != 1 {
			t.Fatalf("fanwire_connections = %v after complete, want 1: the complete must end the subscription, not the connection", n)
		}

		// A second subscription on the same connection gets the next
		// event; the completed one must not: its next would be printed
		// before or right after b's, and before the query's reply.
		nc.subscribe("b", nodeEventsQuery, map[string]any{"s": "app.x"})
		e.waitSubscriptions(1)
		cursors = e.publishAPI(pubEvent{"app.x", `{"after":"complete"}`})
		nc.expect(gqlEventLine("b", "app.x", cursorAt(cursors, 0), `{"after":"complete"}`))
		nc.subscribe("q", `{ health { status } }`, nil)
		nc.expect(`{"key":"q","next":{"data":{"health":{"status":"ok"}}}}`)
		nc.expect(`{"key":"q","complete":true}`)
		nc.send(map[string]any{"cmd": "unsubscribe", "key": "b"})
		nc.expect(`{"unsubscribed":"b"}`)
		nc.expect(`{"key":"b","complete":true}`)
		e.waitSubscriptions(0)
	})
}

// TestGraphQLNodeErrors: a subscription the gateway refuses reaches the npm
// client's error callback with the GraphQL error and its extensions.code,
// and the connection goes on serving.
func TestGraphQLNodeErrors(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	nodeOnEveryBroker(t, func(t *testing.T, e *env, nc *nodeClient) {

		nc.subscribe("p", nodeEventsQuery, map[string]any{"s": "a..b"})
		nc.expect(gqlErrorLine("p", "bad_pattern", `bad pattern: pattern "a..b" has an empty token`))

		nc.subscribe("c", nodeEventsQuery, map[string]any{"s": "app.>", "from": "zz"})
		nc.expect(gqlErrorLine("c", "bad_cursor", map[string]string{
			"nats":      `this gateway's broker keeps no history: subscribe without "from"`,
			"jetstream": `bad cursor: "zz" is not a JetStream cursor (js:<sequence>)`,
			"redis":     `bad cursor: "zz" is not a Redis Streams cursor (rs:<ms>-<seq>)`,
		}[e.kind]))
		if n := e.metric("fanwire_subscriptions", nil); n != 0 {
			t.Fatalf("fanwire_subscriptions = %v after two refused subscriptions, want 0", n)
		}
		if n := e.metric("fanwire_client_errors_total", map[string]string{"code": "bad_pattern"}); n != 1 {
			t.Fatalf("client errors bad_pattern = %v, want 1", n)
		}
		if n := e.metric("fanwire_client_errors_total", map[string]string{"code": "bad_cursor"}); n != 1 {
			t.Fatalf("client errors bad_cursor = %v, want 1", n)
		}

		// The connection still serves: a subscription gets its event.
		nc.subscribe("ok", nodeEventsQuery, map[string]any{"s": "app.*"})
		e.waitSubscriptions(1)
		cursors := e.publishAPI(pubEvent{"app.1", `{"ok":true}`})
		nc.expect(gqlEventLine("ok", "app.1", cursorAt(cursors, 0), `{"ok":true}`))
		if n := e.metric("fanwire_connections", nil); n != 1 {
			t.Fatalf("fanwire_connections = %v, want 1 (errors must not close the connection)", n)
		}
	})
}

// TestGraphQLNodeResume: on the durable brokers, from "first" replays every
// retained event and goes on live; from the cursor of the 2nd event, a new
// connection gets exactly the events after it, then live ones.
func TestGraphQLNodeResume(t *testing.T) {
	t.Parallel()             // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	requireGraphQLFixture(t) // before any broker starts: fail fast
	for _, kind := range []string{"jetstream", "redis"} {
		t.Run(kind, func(t *testing.T) {
			e := graphqlNodeEnv(t, kind)
			var events []pubEvent
			for i := 1; i <= 5; i++ {
				events = append(events, pubEvent{fmt.Sprintf("app.%d", i), fmt.Sprintf(`{"i":%d}`, i)})
			}
			cursors := e.publishAPI(events...)

			// from "first": all five, then live.
			first := startNode(t, e)
			first.subscribe("f", nodeEventsQuery, map[string]any{"s": "app.>", "from": "first"})
			var second string // the cursor of the 2nd event, as the client received it
			for i, ev := range events {
				line := first.next()
				if want := gqlEventLine("f", ev.subject, cursors[i], ev.data); line != want {
					t.Fatalf("replay from first: event %d\n got %s\nwant %s", i+1, line, want)
				}
				if i == 1 {
					var m struct {
						Next struct {
							Data struct {
								Events struct {
									Cursor string `json:"cursor"`
								} `json:"events"`
							} `json:"data"`
						} `json:"next"`
					}
					if err := json.Unmarshal([]byte(line), &m); err != nil {
						t.Fatal(err)
					}
					second = m.Next.Data.Events.Cursor
				}
			}
			live := e.publishAPI(pubEvent{"app.6", `{"i":6}`})
			first.expect(gqlEventLine("f", "app.6", live[0], `{"i":6}`))
			events = append(events, pubEvent{"app.6", `{"i":6}`})
			cursors = append(cursors, live...)

			// from the 2nd event's cursor, on a new connection: 3..6, then live.
			resumed := startNode(t, e)
			resumed.subscribe("r", nodeEventsQuery, map[string]any{"s": "app.>", "from": second})
			for i := 2; i < len(events); i++ {
				resumed.expect(gqlEventLine("r", events[i].subject, cursors[i], events[i].data))
			}
			live = e.publishAPI(pubEvent{"app.7", `{"i":7}`}, pubEvent{"orders.7", `{"i":-7}`}, pubEvent{"app.8", `{"i":8}`})
			resumed.expect(gqlEventLine("r", "app.7", live[0], `{"i":7}`))
			resumed.expect(gqlEventLine("r", "app.8", live[2], `{"i":8}`))
			first.expect(gqlEventLine("f", "app.7", live[0], `{"i":7}`))
			first.expect(gqlEventLine("f", "app.8", live[2], `{"i":8}`))
			e.waitSubscriptions(2)
		})
	}
}

// TestGraphQLNodeQuery: queries over the WebSocket through the npm client:
// one next with the result, then complete.
func TestGraphQLNodeQuery(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	nodeOnEveryBroker(t, func(t *testing.T, e *env, nc *nodeClient) {
		nc.subscribe("h", `{ health { status } }`, nil)
		nc.expect(`{"key":"h","next":{"data":{"health":{"status":"ok"}}}}`)
		nc.expect(`{"key":"h","complete":true}`)
		nc.subscribe("s", `query { health { status ready } subscribable { broker history patterns } }`, nil)
		history := e.kind != "nats"
		nc.expect(fmt.Sprintf(`{"key":"s","next":{"data":{"health":{"status":"ok","ready":true},"subscribable":{"broker":%q,"history":%v,"patterns":["orders.>","app.>"]}}}}`, e.kind, history))
		nc.expect(`{"key":"s","complete":true}`)
		if n := e.metric("fanwire_subscriptions", nil); n != 0 {
			t.Fatalf("fanwire_subscriptions = %v after two queries, want 0", n)
		}
	})
}

// TestGraphQLNodeTokenExpiryReconnects: graphql-transport-ws has no
// message to renew a token, so a connection whose token expires is closed
// with 4001, which graphql-ws retries: it connects again with fresh
// connectionParams (here the next token) and subscribes again, and events
// flow on under the new token.
func TestGraphQLNodeTokenExpiryReconnects(t *testing.T) {
	t.Parallel() // it mostly waits for its own processes (Node, Chromium, nodes): beside the others
	requireGraphQLFixture(t)
	a, err := auth.NewJWTAuth(auth.JWTConfig{SecretFile: writeFile(t, "secret", testSecret)})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvOn(t, "nats", func(c *gateway.Config) {
		c.Subjects = []string{"app.>"}
		c.Authenticate = a.Grant
		c.AllowAnonymousPublish = true // publishAPI publishes without a key
	})
	token := func(exp time.Time) string {
		return sign(t, jwt.SigningMethodHS256, []byte(testSecret), "", jwt.MapClaims{"sub": "u1", "exp": exp.Unix(), "subscribe": []any{"app.>"}})
	}
	// JWT exp has second precision: the first token expires 2-3 s from now.
	soon := time.Now().Add(2 * time.Second).Truncate(time.Second).Add(time.Second)
	nc := startNodeWithTokens(t, e, []string{token(soon), token(time.Now().Add(time.Hour))})
	nc.subscribe("a", nodeEventsQuery, map[string]any{"s": "app.>"})
	e.waitSubscriptions(1)
	e.publishAPI(pubEvent{"app.x", `{"n":1}`})
	nc.expect(gqlEventLine("a", "app.x", "", `{"n":1}`))
	nc.expect(`{"closed":{"code":4001,"reason":"token expired: reconnect with a new one"}}`)
	nc.expect(`{"connected":true}`)
	e.waitSubscriptions(1)
	e.publishAPI(pubEvent{"app.x", `{"n":2}`})
	nc.expect(gqlEventLine("a", "app.x", "", `{"n":2}`))
}
