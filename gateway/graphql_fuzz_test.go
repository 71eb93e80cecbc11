package gateway

import (
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
