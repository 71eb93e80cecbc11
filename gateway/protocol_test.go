package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func TestParseClientFrame(t *testing.T) {
	id128 := strings.Repeat("i", maxIDLen)
	tests := []struct {
		name    string
		in      string
		typ     string // for accepted frames
		id      string // for accepted frames; "" means no id
		subject *string
		err     error  // sentinel the error must wrap; nil when accepted
		msg     string // substring of the error text
	}{
		// Accepted.
		{name: "subscribe", in: `{"type":"subscribe","id":"s1","subject":"orders.*"}`, typ: "subscribe", id: "s1", subject: ptr("orders.*")},
		{name: "subscribe field order", in: `{"subject":"a","id":"s1","type":"subscribe"}`, typ: "subscribe", id: "s1", subject: ptr("a")},
		{name: "subscribe empty subject", in: `{"type":"subscribe","id":"s1","subject":""}`, typ: "subscribe", id: "s1", subject: ptr("")},
		{name: "subscribe 128-byte id", in: `{"type":"subscribe","id":"` + id128 + `","subject":"a"}`, typ: "subscribe", id: id128, subject: ptr("a")},
		{name: "subscribe escaped strings", in: `{"type":"subscribe","id":"s\"1\u00e9","subject":"a\\b"}`, typ: "subscribe", id: "s\"1é", subject: ptr(`a\b`)},
		{name: "unsubscribe", in: `{"type":"unsubscribe","id":"s1"}`, typ: "unsubscribe", id: "s1"},
		{name: "publish", in: `{"type":"publish","id":"p1","subject":"orders.1","data":{"n":1}}`, typ: "publish", id: "p1", subject: ptr("orders.1")},
		{name: "publish null data", in: `{"type":"publish","id":"p1","subject":"a","data":null}`, typ: "publish", id: "p1", subject: ptr("a")},
		{name: "ping", in: `{"type":"ping"}`, typ: "ping"},
		{name: "whitespace around", in: " \n\t{ \"type\" : \"ping\" }\r\n ", typ: "ping"},
		{name: "null id on ping", in: `{"type":"ping","id":null}`, typ: "ping"},
		{name: "refresh", in: `{"type":"refresh","token":"t"}`, typ: "refresh"},
		{name: "refresh with id", in: `{"type":"refresh","id":"r1","token":"t"}`, typ: "refresh", id: "r1"},
		{name: "refresh 128-byte id", in: `{"type":"refresh","id":"` + id128 + `","token":"t"}`, typ: "refresh", id: id128},
		{name: "refresh null id", in: `{"type":"refresh","id":null,"token":"t"}`, typ: "refresh"},

		// Not one JSON object.
		{name: "empty", in: ``, err: ErrBadFrame, msg: "expected one JSON object"},
		{name: "blank", in: " \n", err: ErrBadFrame, msg: "expected one JSON object"},
		{name: "array", in: `[{"type":"ping"}]`, err: ErrBadFrame, msg: "expected one JSON object"},
		{name: "string", in: `"ping"`, err: ErrBadFrame, msg: "expected one JSON object"},
		{name: "null", in: `null`, err: ErrBadFrame, msg: "expected one JSON object"},
		{name: "number", in: `42`, err: ErrBadFrame, msg: "expected one JSON object"},
		{name: "syntax error", in: `{"type":ping}`, err: ErrBadFrame, msg: "invalid JSON at byte"},
		{name: "truncated", in: `{"type":"ping"`, err: ErrBadFrame, msg: "truncated JSON"},
		{name: "truncated string", in: `{"type":"pi`, err: ErrBadFrame, msg: "truncated JSON"},
		{name: "two objects", in: `{"type":"ping"}{"type":"ping"}`, err: ErrBadFrame, msg: "data after the JSON object"},
		{name: "trailing garbage", in: `{"type":"ping"}x`, err: ErrBadFrame, msg: "data after the JSON object"},
		{name: "trailing bracket", in: `{"type":"ping"}]`, err: ErrBadFrame, msg: "data after the JSON object"},
		{name: "unknown field", in: `{"type":"ping","x":1}`, err: ErrBadFrame, msg: `unknown field "x"`},
		{name: "unknown field on subscribe", in: `{"type":"subscribe","id":"s","subject":"a","extra":null}`, err: ErrBadFrame, msg: `unknown field "extra"`},
		{name: "field name case", in: `{"Type":"ping"}`, err: ErrBadFrame, msg: `unknown field "Type"`},
		{name: "repeated key", in: `{"type":"subscribe","id":"s","subject":"a","type":"ping"}`, err: ErrBadFrame, msg: `"type"`},
		{name: "repeated key via escape", in: `{"id":"a","type":"unsubscribe","id":"b"}`, err: ErrBadFrame, msg: `"id"`},
		{name: "type not a string", in: `{"type":1}`, err: ErrBadFrame, msg: `field "type" must be a string`},
		{name: "id not a string", in: `{"type":"unsubscribe","id":7}`, err: ErrBadFrame, msg: `field "id" must be a string`},
		{name: "subject an object", in: `{"type":"subscribe","id":"s","subject":{}}`, err: ErrBadFrame, msg: `field "subject" must be a string`},

		// Wrong fields for the type.
		{name: "missing type", in: `{}`, err: ErrBadFrame, msg: `missing "type"`},
		{name: "null type", in: `{"type":null,"id":"s1"}`, err: ErrBadFrame, msg: `missing "type"`},
		{name: "empty type", in: `{"type":""}`, err: ErrBadFrame, msg: `missing "type"`},
		{name: "unknown type", in: `{"type":"send"}`, err: ErrUnknownType, msg: `"send"`},
		{name: "publish no id", in: `{"type":"publish","subject":"a","data":1}`, err: ErrBadFrame, msg: `missing "id"`},
		{name: "publish no subject", in: `{"type":"publish","id":"p","data":1}`, err: ErrBadFrame, msg: `publish needs "subject"`},
		{name: "publish no data", in: `{"type":"publish","id":"p","subject":"a"}`, err: ErrBadFrame, msg: `publish needs "data"`},
		{name: "publish with from", in: `{"type":"publish","id":"p","subject":"a","data":1,"from":"first"}`, err: ErrBadFrame, msg: `publish takes only`},
		{name: "subscribe with data", in: `{"type":"subscribe","id":"s","subject":"a","data":1}`, err: ErrBadFrame, msg: `"data" belongs in a publish`},
		{name: "ping with data", in: `{"type":"ping","data":1}`, err: ErrBadFrame, msg: "ping takes no other field"},
		{name: "type is case-sensitive", in: `{"type":"PING"}`, err: ErrUnknownType, msg: `"PING"`},
		{name: "subscribe no id", in: `{"type":"subscribe","subject":"a"}`, err: ErrBadFrame, msg: `missing "id"`},
		{name: "subscribe null id", in: `{"type":"subscribe","id":null,"subject":"a"}`, err: ErrBadFrame, msg: `missing "id"`},
		{name: "subscribe empty id", in: `{"type":"subscribe","id":"","subject":"a"}`, err: ErrBadFrame, msg: `missing "id"`},
		{name: "subscribe 129-byte id", in: `{"type":"subscribe","id":"` + id128 + `x","subject":"a"}`, err: ErrBadFrame, msg: `"id" longer than 128 bytes`},
		{name: "subscribe no subject", in: `{"type":"subscribe","id":"s1"}`, err: ErrBadFrame, msg: `subscribe needs "subject"`},
		{name: "subscribe null subject", in: `{"type":"subscribe","id":"s1","subject":null}`, err: ErrBadFrame, msg: `subscribe needs "subject"`},
		{name: "unsubscribe no id", in: `{"type":"unsubscribe"}`, err: ErrBadFrame, msg: `missing "id"`},
		{name: "unsubscribe 129-byte id", in: `{"type":"unsubscribe","id":"` + id128 + `x"}`, err: ErrBadFrame, msg: `"id" longer than 128 bytes`},
		{name: "unsubscribe with subject", in: `{"type":"unsubscribe","id":"s1","subject":"a"}`, err: ErrBadFrame, msg: `unsubscribe takes only "id"`},
		{name: "ping with id", in: `{"type":"ping","id":"s1"}`, err: ErrBadFrame, msg: "ping takes no other field"},
		{name: "ping with subject", in: `{"type":"ping","subject":"a"}`, err: ErrBadFrame, msg: "ping takes no other field"},
		{name: "ping with empty id", in: `{"type":"ping","id":""}`, err: ErrBadFrame, msg: "ping takes no other field"},
		{name: "refresh no token", in: `{"type":"refresh","id":"r1"}`, err: ErrBadFrame, msg: `refresh needs "token"`},
		{name: "refresh empty token", in: `{"type":"refresh","token":""}`, err: ErrBadFrame, msg: `refresh needs "token"`},
		{name: "refresh empty id", in: `{"type":"refresh","id":"","token":"t"}`, err: ErrBadFrame, msg: `missing "id"`},
		{name: "refresh 129-byte id", in: `{"type":"refresh","id":"` + id128 + `x","token":"t"}`, err: ErrBadFrame, msg: `"id" longer than 128 bytes`},
		{name: "refresh with subject", in: `{"type":"refresh","id":"r1","token":"t","subject":"a"}`, err: ErrBadFrame, msg: `refresh takes only "token" and an optional "id"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, err := parseClientFrame([]byte(tt.in))
			if tt.err != nil {
				if err == nil {
					t.Fatalf("parseClientFrame(%q) = %+v, nil; want an error wrapping %v", tt.in, f, tt.err)
				}
				if !errors.Is(err, tt.err) {
					t.Errorf("error %q does not wrap %v", err, tt.err)
				}
				if !strings.Contains(err.Error(), tt.msg) {
					t.Errorf("error %q does not contain %q", err, tt.msg)
				}
				checkErrorMessage(t, f, err)
				return
			}
			if err != nil {
				t.Fatalf("parseClientFrame(%q): %v", tt.in, err)
			}
			if f.Type != tt.typ {
				t.Errorf("type %q, want %q", f.Type, tt.typ)
			}
			if got := deref(f.ID); got != tt.id || (f.ID == nil) != (tt.id == "") {
				t.Errorf("id %v, want %q", f.ID, tt.id)
			}
			if (f.Subject == nil) != (tt.subject == nil) || (f.Subject != nil && *f.Subject != *tt.subject) {
				t.Errorf("subject %v, want %v", f.Subject, tt.subject)
			}
		})
	}
}

// TestParseClientFrameFieldNamesAreCaseSensitive: docs/protocol.md says
// unknown fields are errors, and JSON object keys are case-sensitive, so
// "Type" or "ID" is an unknown field. encoding/json matches struct fields
// case-insensitively, even with DisallowUnknownFields, so these frames are
// accepted today.
func TestParseClientFrameFieldNamesAreCaseSensitive(t *testing.T) {
	for _, in := range []string{
		`{"Type":"ping"}`,
		`{"TYPE":"ping"}`,
		`{"type":"unsubscribe","ID":"s1"}`,
		`{"type":"subscribe","Id":"s1","Subject":"a"}`,
	} {
		if f, err := parseClientFrame([]byte(in)); err == nil {
			t.Errorf("parseClientFrame(%s) = %+v, nil; want ErrBadFrame for a field name that is not exactly type/id/subject", in, f)
		}
	}
}

// checkErrorMessage builds the error reply the connection sends for err (as
// conn.handle does) and checks that it is valid JSON with the expected
// fields.
func checkErrorMessage(t testing.TB, f clientFrame, err error) {
	t.Helper()
	id, code := errorReply(f, err)
	msg := errorMessage(id, code, err.Error())
	if !json.Valid(msg) {
		t.Fatalf("errorMessage for %q is not valid JSON: %q", err, msg)
	}
	if !utf8.Valid(msg) {
		t.Fatalf("errorMessage for %q is not valid UTF-8 (a text frame must be): %q", err, msg)
	}
	var got map[string]string
	if err := json.Unmarshal(msg, &got); err != nil {
		t.Fatalf("errorMessage %q: %v", msg, err)
	}
	if got["type"] != "error" || got["code"] != code || got["message"] != string([]rune(err.Error())) {
		t.Fatalf("errorMessage %q decodes to %v", msg, got)
	}
	if _, ok := got["id"]; ok != (id != "") {
		t.Fatalf("errorMessage %q: id present %v, want %v", msg, ok, id != "")
	}
}

func TestErrorMessage(t *testing.T) {
	tests := []struct {
		id, code, msg string
		want          string
	}{
		{"", CodeBadFrame, "x", `{"type":"error","code":"bad_frame","message":"x"}`},
		{"s1", CodeBadPattern, `bad "p"`, `{"type":"error","id":"s1","code":"bad_pattern","message":"bad \"p\""}`},
		{"a\nb", CodeUnknownID, "\\", `{"type":"error","id":"a\nb","code":"unknown_id","message":"\\"}`},
		{"\xff", CodeBadFrame, "\x00", `{"type":"error","id":"\ufffd","code":"bad_frame","message":"\u0000"}`},
	}
	for _, tt := range tests {
		got := errorMessage(tt.id, tt.code, tt.msg)
		if string(got) != tt.want {
			t.Errorf("errorMessage(%q, %q, %q) = %s, want %s", tt.id, tt.code, tt.msg, got, tt.want)
		}
		if !json.Valid(got) {
			t.Errorf("errorMessage(%q, %q, %q) is not valid JSON", tt.id, tt.code, tt.msg)
		}
	}
}

func TestReplyMessages(t *testing.T) {
	for _, tt := range []struct {
		got  []byte
		want string
	}{
		{replyMessage("subscribed", "s1"), `{"type":"subscribed","id":"s1"}`},
		{replyMessage("unsubscribed", `q"\`), `{"type":"unsubscribed","id":"q\"\\"}`},
		{readyMessage("9f1c2e4b7a0d3e61", false, nil, time.UnixMilli(1764763200123)), `{"type":"ready","connection_id":"9f1c2e4b7a0d3e61","time":1764763200123}`},
		{readyMessage("9f1c2e4b7a0d3e61", true, readyLimits(&Config{ReadLimit: 65536, MaxPublishBytes: 1 << 20, MaxMessageRate: 100}), time.UnixMilli(1)), `{"type":"ready","connection_id":"9f1c2e4b7a0d3e61","history":true,"time":1,"limits":{"frame":65536,"data":1048576,"rate":100,"burst":200}}`},
		{readyMessage("9f1c2e4b7a0d3e61", false, readyLimits(&Config{ReadLimit: 1024, MaxPublishBytes: 512, MaxMessageRate: -1}), time.UnixMilli(1)), `{"type":"ready","connection_id":"9f1c2e4b7a0d3e61","time":1,"limits":{"frame":1024,"data":512,"rate":0,"burst":0}}`},
		{readyMessage(newConnID(), false, nil, time.Now()), ""},
		{pongMessage, `{"type":"pong"}`},
		{refreshedMessage("", time.Time{}), `{"type":"refreshed"}`},
		{refreshedMessage("r1", time.Date(2026, 11, 30, 19, 0, 0, 0, time.FixedZone("", 3600))), `{"type":"refreshed","id":"r1","expires":"2026-11-30T18:00:00Z"}`},
		{refreshedMessage(`q"\`, time.Time{}), `{"type":"refreshed","id":"q\"\\"}`},
	} {
		if !json.Valid(tt.got) {
			t.Errorf("%s is not valid JSON", tt.got)
		}
		if tt.want != "" && string(tt.got) != tt.want {
			t.Errorf("got %s, want %s", tt.got, tt.want)
		}
	}
}

// FuzzClientFrame feeds arbitrary bytes to parseClientFrame: it never
// panics, an accepted frame is a known type with exactly its fields and
// survives re-encoding (checkFrameRoundTrip), and the error reply for a
// rejected one is valid JSON.
func FuzzClientFrame(f *testing.F) {
	for _, s := range []string{
		`{"type":"subscribe","id":"s1","subject":"orders.*"}`,
		`{"type":"unsubscribe","id":"s1"}`,
		`{"type":"ping"}`,
		`{"type":"refresh","id":"r1","token":"t"}`,
		`{"type":"subscribe","id":"` + strings.Repeat("i", maxIDLen+1) + `","subject":"a"}`,
		`{"type":"publish","id":"\ud800"}`,
		`{"type":"ping"}{}`,
		`{"type":"subscribe","id":"s1","subject":"orders.>","from":"first","durable":"d1"}`,
		`{"type":"subscribe","id":"s1","subject":"orders.>","from":""}`,
		`{"type":"unsubscribe","id":"s1","durable":"d1"}`,
		`{"type":"subscribe","id":"\u00e9\ud83d\ude00","subject":"a\u0000b","from":null}`,
		`{"type":"ping","x":[1,{"y":null}]}`,
		`{"type":1}`,
		`{"type":"subscribe","id":"s1","subject":5}`,
		`{"Type":"ping"}`,
		`{"type":"subscribe","type":"ping"}`,
		"{\"type\":\"\xff\"}",
		`{"type":"sub`,
		`[]`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		fr, err := parseClientFrame(data)
		if err != nil {
			if !errors.Is(err, ErrBadFrame) && !errors.Is(err, ErrUnknownType) {
				t.Fatalf("error %q wraps neither ErrBadFrame nor ErrUnknownType", err)
			}
			checkErrorMessage(t, fr, err)
			return
		}
		if !json.Valid(data) {
			t.Fatalf("accepted invalid JSON %q", data)
		}
		switch fr.Type {
		case "subscribe":
			if fr.ID == nil || *fr.ID == "" || len(*fr.ID) > maxIDLen || fr.Subject == nil {
				t.Fatalf("accepted subscribe without a usable id and a subject: %q", data)
			}
			if (fr.From != nil && *fr.From == "") || fr.Token != nil || fr.Data != nil {
				t.Fatalf("accepted subscribe with an empty \"from\" or a token: %q", data)
			}
		case "unsubscribe":
			if fr.ID == nil || *fr.ID == "" || len(*fr.ID) > maxIDLen || fr.Subject != nil || fr.From != nil || fr.Durable != nil || fr.Token != nil || fr.Data != nil {
				t.Fatalf("accepted bad unsubscribe: %q", data)
			}
		case "ping":
			if fr.ID != nil || fr.Subject != nil || fr.From != nil || fr.Durable != nil || fr.Token != nil || fr.Data != nil {
				t.Fatalf("accepted ping with fields: %q", data)
			}
		case "refresh":
			if fr.Token == nil || *fr.Token == "" || (fr.ID != nil && (*fr.ID == "" || len(*fr.ID) > maxIDLen)) || fr.Subject != nil || fr.From != nil || fr.Durable != nil || fr.Data != nil {
				t.Fatalf("accepted bad refresh: %q", data)
			}
			if r := refreshedMessage(deref(fr.ID), time.Time{}); !json.Valid(r) || !utf8.Valid(r) {
				t.Fatalf("refreshed for %q is not valid JSON/UTF-8: %q", data, r)
			}
		case "publish":
			checkPublishFrame(t, data, fr)
		default:
			t.Fatalf("accepted unknown type %q: %q", fr.Type, data)
		}
		checkTopLevelKeys(t, data)
		checkFrameRoundTrip(t, data, fr)
		// The replies built from an accepted frame are valid JSON too.
		if fr.ID != nil {
			if r := replyMessage("subscribed", *fr.ID); !json.Valid(r) || !utf8.Valid(r) {
				t.Fatalf("reply for id %q is not valid JSON/UTF-8: %q", *fr.ID, r)
			}
		}
	})
}

// checkTopLevelKeys checks that an accepted frame's keys are exactly (case
// included) among type, id, subject, from, durable and token, each at most
// once.
func checkTopLevelKeys(t testing.TB, data []byte) {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil {
		t.Fatalf("accepted %q: %v", data, err)
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatalf("accepted %q: %v", data, err)
		}
		key := tok.(string)
		if !slices.Contains([]string{"type", "id", "subject", "from", "durable", "token", "data"}, key) || seen[key] {
			t.Fatalf("accepted %q with key %q (unknown, or repeated)", data, key)
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			t.Fatalf("accepted %q: %v", data, err)
		}
	}
}

// checkFrameRoundTrip re-encodes an accepted frame's fields (those present)
// as a JSON object and checks that parseClientFrame accepts it and gives
// the same frame.
func checkFrameRoundTrip(t testing.TB, data []byte, fr clientFrame) {
	t.Helper()
	m := map[string]string{"type": fr.Type}
	for key, p := range map[string]*string{"id": fr.ID, "subject": fr.Subject, "from": fr.From, "durable": fr.Durable, "token": fr.Token} {
		if p != nil {
			m[key] = *p
		}
	}
	var enc []byte
	var err error
	if fr.Data != nil {
		all := map[string]any{"data": fr.Data}
		for k, v := range m {
			all[k] = v
		}
		enc, err = json.Marshal(all)
	} else {
		enc, err = json.Marshal(m)
	}
	if err != nil {
		t.Fatalf("re-encode %q: %v", data, err)
	}
	again, err := parseClientFrame(enc)
	if err != nil {
		t.Fatalf("accepted %q, but not its re-encoding %s: %v", data, enc, err)
	}
	same := func(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }
	if again.Type != fr.Type || !same(again.ID, fr.ID) || !same(again.Subject, fr.Subject) || !same(again.From, fr.From) || !same(again.Durable, fr.Durable) || !same(again.Token, fr.Token) || !sameRawJSON(again.Data, fr.Data) {
		t.Fatalf("%q parses to %+v, its re-encoding %s to %+v", data, fr, enc, again)
	}
}

func ptr(s string) *string { return &s }

// sameRawJSON reports whether two raw JSON values (nil: absent) are the same
// value once compacted.
func sameRawJSON(a, b json.RawMessage) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var ca, cb bytes.Buffer
	return json.Compact(&ca, a) == nil && json.Compact(&cb, b) == nil && bytes.Equal(ca.Bytes(), cb.Bytes())
}
