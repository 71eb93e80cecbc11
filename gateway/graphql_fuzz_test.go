package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzGraphQLClientMessage feeds arbitrary bytes through the decoding that
// gqlHandle does on a GraphQL client message: decodeObject into
// gqlClientMessage and, for subscribe and start, of its payload into
// gqlSubscribePayload. It never panics; every error has a non-empty
// message that, as the close reason gqlHandle builds from it, is valid
// UTF-8 (RFC 6455 requires it) and names no Go type.
func FuzzGraphQLClientMessage(f *testing.F) {
	for _, s := range []string{
		`{"type":"connection_init","payload":{"token":"t"}}`,
		`{"id":"1","type":"subscribe","payload":{"query":"subscription { events(subject: \"orders.*\") { subject data } }","variables":{"s":"orders.>"},"operationName":"S","extensions":{}}}`,
		`{"id":"1","type":"start","payload":{"query":"{ __typename }"}}`,
		`{"type":"ping"}`,
		`{"id":"1","type":"complete"}`,
		`{"id":"1","type":"subscribe","payload":null}`,
		`{"id":"1","type":"subscribe","payload":{"query":null,"variables":[1]}}`,
		`{"id":1,"type":"subscribe"}`,
		`{"Type":"ping"}`,
		`{"type":"ping","type":"pong"}`,
		"{\"type\":\"\xff\",\"\xfe\":1}",
		`{"id":"1","type":"subscribe","payload":{"query":"q","variables":{"a":{"b":[`,
		`{"type":"ping"} {}`,
		`[]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var m gqlClientMessage
		if err := decodeObject(data, &m, "id", "type", "payload"); err != nil {
			checkGQLError(t, data, "invalid message: ", err)
			return
		}
		if m.Type != "subscribe" && m.Type != "start" {
			return
		}
		var p gqlSubscribePayload
		if err := decodeObject(m.Payload, &p, "query", "operationName", "variables", "extensions"); err != nil {
			checkGQLError(t, data, m.Type+" payload: ", err)
		}
	})
}

var quoted = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)

// checkGQLError checks an error from decoding the GraphQL client message
// data, which gqlHandle would send as the close reason prefix+err.
func checkGQLError(t testing.TB, data []byte, prefix string, err error) {
	t.Helper()
	msg := err.Error()
	if msg == "" {
		t.Fatalf("%q: empty error", data)
	}
	if reason := prefix + msg; !utf8.ValidString(reason) {
		t.Fatalf("%q: close reason %q is not valid UTF-8", data, reason)
	}
	// Quoted parts are keys, field names or characters from the input.
	bare := quoted.ReplaceAllString(msg, `""`)
	for _, goName := range []string{"interface {", "map[", "json.", "gateway.", "*string", "struct {"} {
		if strings.Contains(bare, goName) {
			t.Fatalf("%q: error %q names a Go type", data, msg)
		}
	}
}

// FuzzGraphQLHTTP sends arbitrary requests to a real Server's /graphql: a
// raw POST body, a query over GET, or a query inside a well-formed POST
// body (so the fuzzer works on GraphQL text itself). Whatever it sends,
// the handler does not panic, answers valid JSON, and the answer stays
// bounded (the body cap is 64 KiB here; gqlgen quotes a body it cannot
// decode in its error). A hang fails the run at go test's -timeout.
func FuzzGraphQLHTTP(f *testing.F) {
	s := newTestServer(f)
	s.cfg.GraphQLMaxBodyBytes = 64 << 10
	h := s.Handler()
	const (
		rawPost = iota
		get
		queryPost
	)
	for _, seed := range []struct {
		mode  uint8
		input string
	}{
		{queryPost, "{" + strings.Repeat(" a:health{status} a:subscribable{broker}", 1500) + " }"},
		{get, "{" + strings.Repeat(" a:health{status} a:subscribable{broker}", 1500) + " }"},
		{queryPost, "mutation {" + strings.Repeat(` publish(subject:"x",data:1){subject}`, 300) + " }"},
		{queryPost, "{" + strings.Repeat(" health{status}", 1000) + " }"},
		{queryPost, "{ ...F0 } fragment F0 on Query { ...F1 ...F1 } fragment F1 on Query { ...F2 ...F2 } fragment F2 on Query { health { status } }"},
		{queryPost, "{ ...A } fragment A on Query { ...B } fragment B on Query { ...A }"},
		{queryPost, strings.Repeat("{ __schema { types { fields { type { ofType ", 20)},
		{queryPost, `{ __type(name: "Query") { name fields(includeDeprecated: true) { name } } }`},
		{rawPost, `{"query":"{ health { status ready reasons connections } }"}`},
		{rawPost, `{"query":"query Q($s: String!) { __type(name: $s) { name } }","variables":{"s":"Event"},"operationName":"Q"}`},
		{rawPost, `{"query":`},
		{rawPost, `[{"query":"{ health { status } }"}]`},
		{rawPost, `{"query":"{ health { status } }","variables":{"a":[[[[[[[[[[1]]]]]]]]]]}}`},
		{get, "subscription { events(subject: \"x\") { data } }"},
		{get, "#"},
	} {
		f.Add(seed.mode, seed.input)
	}
	f.Fuzz(func(t *testing.T, mode uint8, input string) {
		var req *http.Request
		switch mode % 3 {
		case rawPost:
			req = httptest.NewRequest(http.MethodPost, "/graphql", strings.NewReader(input))
			req.Header.Set("Content-Type", "application/json")
		case get:
			req = httptest.NewRequest(http.MethodGet, "/graphql?query="+url.QueryEscape(input), nil)
		case queryPost:
			body, _ := json.Marshal(map[string]string{"query": input})
			req = httptest.NewRequest(http.MethodPost, "/graphql", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		b := rec.Body.Bytes()
		if !json.Valid(b) {
			t.Fatalf("%d: response is not JSON: %.300q", rec.Code, b)
		}
		if max := 4*s.cfg.GraphQLMaxBodyBytes + 1<<20; int64(len(b)) > max {
			t.Fatalf("%d: response of %d bytes, over %d", rec.Code, len(b), max)
		}
	})
}
