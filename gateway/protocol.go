package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fanwire/fanwire/jsonstr"
)

// maxIDLen bounds client-chosen subscription ids.
const maxIDLen = 128

// clientFrame is one client → server message of the native protocol. Fields
// are pointers so that "absent" and "empty" differ: each type says which
// fields it takes, and any other field is an error.
type clientFrame struct {
	Type    string          `json:"type"`
	ID      *string         `json:"id"`
	Subject *string         `json:"subject"`
	From    *string         `json:"from"`    // subscribe: a cursor, "first" or "latest"
	Where   *string         `json:"where"`   // subscribe: a filter on the events' data (CEL; package gateway/internal/filter)
	Durable *string         `json:"durable"` // subscribe: bind (or create) the named durable consumer
	Token   *string         `json:"token"`   // refresh: a new connection token
	Data    json.RawMessage `json:"data"`    // publish: the event's data, any JSON value

	// Presence (package internal/presence).
	Presence *bool           `json:"presence"` // subscribe: also the presence changes of the subjects it matches
	State    json.RawMessage `json:"state"`    // track: the member's state, any JSON value
	Resume   *string         `json:"resume"`   // track: the secret of a member to resume
	After    *string         `json:"after"`    // members: the page starts after this member's key
	Limit    *int            `json:"limit"`    // members: the page's size (1 to maxMembersPage)
}

// presenceFields reports which of the presence fields f holds, by name.
func (f *clientFrame) presenceFields() []string {
	var names []string
	if f.Presence != nil {
		names = append(names, "presence")
	}
	if f.State != nil {
		names = append(names, "state")
	}
	if f.After != nil {
		names = append(names, "after")
	}
	if f.Limit != nil {
		names = append(names, "limit")
	}
	if f.Resume != nil {
		names = append(names, "resume")
	}
	return names
}

// only checks that f holds no field beyond allowed, among all of them.
func (f *clientFrame) only(allowed ...string) error {
	present := f.presenceFields()
	for _, kv := range []struct {
		name string
		set  bool
	}{{"id", f.ID != nil}, {"subject", f.Subject != nil}, {"from", f.From != nil}, {"where", f.Where != nil},
		{"durable", f.Durable != nil}, {"token", f.Token != nil}, {"data", f.Data != nil}} {
		if kv.set {
			present = append(present, kv.name)
		}
	}
	for _, name := range present {
		if !slices.Contains(allowed, name) {
			return fmt.Errorf("%w: %s takes only %s, not %q", ErrBadFrame, f.Type, strings.Join(quoteAll(allowed), ", "), name)
		}
	}
	return nil
}

func quoteAll(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strconv.Quote(v)
	}
	return out
}

// maxMembersPage bounds a members page; defaultMembersPage is its size
// when the request gives none.
const (
	maxMembersPage     = 1000
	defaultMembersPage = 100
)

// parseClientFrame decodes and validates one client frame. Every error wraps
// ErrBadFrame or ErrUnknownType and says what is wrong.
func parseClientFrame(data []byte) (clientFrame, error) {
	var f clientFrame
	if err := decodeObject(data, &f, "type", "id", "subject", "from", "where", "durable", "token", "data", "presence", "state", "after", "limit", "resume"); err != nil {
		return f, fmt.Errorf("%w: %s", ErrBadFrame, err.Error())
	}
	switch f.Type {
	case "track", "untrack", "members":
		if err := checkID(f.ID); err != nil {
			return f, err
		}
		if f.Subject == nil {
			return f, fmt.Errorf("%w: %s needs \"subject\"", ErrBadFrame, f.Type)
		}
		allowed := []string{"id", "subject"}
		switch f.Type {
		case "track":
			allowed = append(allowed, "state", "resume")
		case "members":
			allowed = append(allowed, "after", "limit")
			if f.Limit != nil && (*f.Limit < 1 || *f.Limit > maxMembersPage) {
				return f, fmt.Errorf("%w: \"limit\" must be 1 to %d", ErrBadFrame, maxMembersPage)
			}
		}
		if err := f.only(allowed...); err != nil {
			return f, err
		}
		return f, nil
	}
	if f.Type != "subscribe" && f.Presence != nil {
		return f, fmt.Errorf("%w: \"presence\" belongs in a subscribe", ErrBadFrame)
	}
	if names := f.presenceFields(); len(names) > 0 && (f.Type != "subscribe" || len(names) > 1 || names[0] != "presence") {
		return f, fmt.Errorf("%w: %q does not take %q", ErrBadFrame, f.Type, names[len(names)-1])
	}
	switch f.Type {
	case "subscribe":
		if err := checkID(f.ID); err != nil {
			return f, err
		}
		if f.Subject == nil {
			return f, fmt.Errorf("%w: subscribe needs \"subject\"", ErrBadFrame)
		}
		if f.From != nil && *f.From == "" {
			return f, fmt.Errorf("%w: \"from\" must be a cursor, \"first\" or \"latest\"", ErrBadFrame)
		}
		if f.From != nil && *f.From == "latest" && f.Durable != nil {
			return f, fmt.Errorf("%w: a durable starts where it left off: \"from\":\"latest\" takes no \"durable\"", ErrBadFrame)
		}
		if f.Token != nil {
			return f, fmt.Errorf("%w: \"token\" belongs in a refresh", ErrBadFrame)
		}
		if f.Data != nil {
			return f, fmt.Errorf("%w: \"data\" belongs in a publish", ErrBadFrame)
		}
		if f.Presence != nil && *f.Presence && (f.From != nil || f.Durable != nil) {
			return f, fmt.Errorf("%w: presence starts live: a subscribe with \"presence\" takes no \"from\" nor \"durable\" (subscribe to the presence apart, and ask for the members)", ErrBadFrame)
		}
	case "publish":
		if err := checkID(f.ID); err != nil {
			return f, err
		}
		if f.Subject == nil {
			return f, fmt.Errorf("%w: publish needs \"subject\"", ErrBadFrame)
		}
		if f.Data == nil {
			return f, fmt.Errorf("%w: publish needs \"data\" (any JSON value)", ErrBadFrame)
		}
		if f.From != nil || f.Where != nil || f.Durable != nil || f.Token != nil {
			return f, fmt.Errorf("%w: publish takes only \"id\", \"subject\" and \"data\"", ErrBadFrame)
		}
	case "unsubscribe":
		if err := checkID(f.ID); err != nil {
			return f, err
		}
		if f.Subject != nil || f.From != nil || f.Where != nil || f.Durable != nil || f.Token != nil || f.Data != nil {
			return f, fmt.Errorf("%w: unsubscribe takes only \"id\"", ErrBadFrame)
		}
	case "ping":
		if f.ID != nil || f.Subject != nil || f.From != nil || f.Where != nil || f.Durable != nil || f.Token != nil || f.Data != nil {
			return f, fmt.Errorf("%w: ping takes no other field", ErrBadFrame)
		}
	case "refresh":
		if f.Token == nil || *f.Token == "" {
			return f, fmt.Errorf("%w: refresh needs \"token\"", ErrBadFrame)
		}
		if f.ID != nil {
			if err := checkID(f.ID); err != nil {
				return f, err
			}
		}
		if f.Subject != nil || f.From != nil || f.Where != nil || f.Durable != nil || f.Data != nil {
			return f, fmt.Errorf("%w: refresh takes only \"token\" and an optional \"id\"", ErrBadFrame)
		}
	case "":
		return f, fmt.Errorf("%w: missing \"type\"", ErrBadFrame)
	default:
		return f, fmt.Errorf("%w: %q", ErrUnknownType, f.Type)
	}
	return f, nil
}

// decodeObject decodes exactly one JSON object into v, whose only allowed
// keys are fields: encoding/json alone would accept "Type" for "type" (it
// matches names case-insensitively) and let a repeated key win silently, so
// the top-level keys are checked first. Errors are worded for clients.
func decodeObject(b []byte, v any, fields ...string) error {
	if t := bytes.TrimSpace(b); len(t) == 0 || t[0] != '{' {
		return errors.New("expected one JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if _, err := dec.Token(); err != nil { // '{'
		return errors.New(jsonErrorText(err))
	}
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return errors.New(jsonErrorText(err))
		}
		key, _ := tok.(string)
		if !slices.Contains(fields, key) {
			return fmt.Errorf("unknown field %q (allowed: %s)", key, strings.Join(fields, ", "))
		}
		if seen[key] {
			return fmt.Errorf("field %q given twice", key)
		}
		seen[key] = true
		var skip json.RawMessage
		if err := dec.Decode(&skip); err != nil {
			return errors.New(jsonErrorText(err))
		}
	}
	if _, err := dec.Token(); err != nil { // '}'
		return errors.New(jsonErrorText(err))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("data after the JSON object")
	}
	if err := json.Unmarshal(b, v); err != nil {
		return errors.New(jsonErrorText(err))
	}
	return nil
}

// errorReply returns the id and code of the error reply for a frame that
// parseClientFrame rejected with err: the frame's id when it had a usable
// one, and unknown_type or bad_frame.
func errorReply(f clientFrame, err error) (id, code string) {
	code = CodeBadFrame
	if errors.Is(err, ErrUnknownType) {
		code = CodeUnknownType
	}
	if f.ID != nil && len(*f.ID) <= maxIDLen {
		id = *f.ID
	}
	return id, code
}

// deref returns *p, "" for nil (an optional field left out).
func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

func checkID(id *string) error {
	switch {
	case id == nil || *id == "":
		return fmt.Errorf("%w: missing \"id\"", ErrBadFrame)
	case len(*id) > maxIDLen:
		return fmt.Errorf("%w: \"id\" longer than %d bytes", ErrBadFrame, maxIDLen)
	}
	return nil
}

// jsonErrorText turns encoding/json errors into messages for clients,
// without Go type names.
func jsonErrorText(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return "invalid JSON at byte " + strconv.FormatInt(se.Offset, 10) + ": " + se.Error()
	case errors.As(err, &te):
		return fmt.Sprintf("field %q must be a %s", te.Field, jsonKind(te.Type.Kind().String()))
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "truncated JSON"
	}
	return err.Error() // e.g. `json: unknown field "x"`
}

func jsonKind(goKind string) string {
	switch goKind {
	case "string", "ptr":
		return "string"
	case "struct", "map":
		return "object"
	case "slice", "array":
		return "array"
	case "int", "int64", "float64":
		return "number"
	}
	return goKind
}

// Server → client control messages. Built by hand: they are tiny and the
// field values are ids we validated or codes we own.

// readyMessage is the first message of a native connection; history says
// that the broker keeps history (events carry cursors, subscribe takes
// from), so a client knows whether a reconnect can resume.
func readyMessage(connID string, history bool, limits []byte, now time.Time) []byte {
	b := append([]byte(`{"type":"ready","connection_id":`), strconv.Quote(connID)...)
	if history {
		b = append(b, `,"history":true`...)
	}
	b = append(b, `,"time":`...)
	b = strconv.AppendInt(b, now.UnixMilli(), 10)
	b = append(b, limits...)
	return append(b, '}')
}

// readyLimits is the "limits" member of every "ready" (with its leading
// comma): what a client must stay under so that nothing it sends is
// refused for its size or rate. frame: the largest client frame in bytes
// (ReadLimit; over it the connection closes 1009); data: the largest
// publish's data (MaxPublishBytes or the broker's limit); rate and burst:
// the message rate (MaxMessageRate; 0: none). fanwire.js paces itself and
// checks sizes with them.
func readyLimits(cfg *Config) []byte {
	data, _ := cfg.maxPublishable()
	rate := max(cfg.MaxMessageRate, 0)
	b := append([]byte(`,"limits":{"frame":`), strconv.FormatInt(cfg.ReadLimit, 10)...)
	b = append(b, `,"data":`...)
	b = strconv.AppendInt(b, data, 10)
	b = append(b, `,"rate":`...)
	b = strconv.AppendInt(b, int64(rate), 10)
	b = append(b, `,"burst":`...)
	b = strconv.AppendInt(b, int64(2*rate), 10)
	return append(b, '}')
}

func replyMessage(typ, id string) []byte {
	b := append([]byte(`{"type":"`), typ...)
	b = append(b, `","id":`...)
	b = jsonstr.Append(b, id)
	return append(b, '}')
}

// subscribedMessage is the subscribe reply; cursor (omitted when empty) is
// the position the subscription starts after.
func subscribedMessage(id, cursor string) []byte {
	b := append([]byte(`{"type":"subscribed","id":`), jsonstr.Append(nil, id)...)
	if cursor != "" {
		b = append(b, `,"cursor":`...)
		b = jsonstr.Append(b, cursor)
	}
	return append(b, '}')
}

// syncedMessage ends a subscription's snapshot or catch-up: from here on
// it is live, and its view is complete at cursor (omitted when empty).
// keys (a filtered view's resume: every subject it holds) is written when
// not nil.
func syncedMessage(id, cursor string, keys []string) []byte {
	n := 48 + len(id) + len(cursor)
	for _, k := range keys {
		n += len(k) + 3
	}
	b := make([]byte, 0, n)
	b = append(b, `{"type":"synced","id":`...)
	b = jsonstr.Append(b, id)
	if cursor != "" {
		b = append(b, `,"cursor":`...)
		b = jsonstr.Append(b, cursor)
	}
	if keys != nil {
		b = append(b, `,"keys":[`...)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonstr.Append(b, k)
		}
		b = append(b, ']')
	}
	return append(b, '}')
}

var pongMessage = []byte(`{"type":"pong"}`)

// publishedMessage acknowledges a publish: the broker has the event;
// cursor (omitted when empty: Core NATS) is its position.
func publishedMessage(id, cursor string) []byte {
	b := append([]byte(`{"type":"published","id":`), jsonstr.Append(nil, id)...)
	if cursor != "" {
		b = append(b, `,"cursor":`...)
		b = jsonstr.Append(b, cursor)
	}
	return append(b, '}')
}

// frameID returns the "id" of a client frame that was not parsed (a
// message dropped over the rate limit), "" when it has no usable one.
func frameID(data []byte) string {
	var f struct {
		ID *string `json:"id"`
	}
	if json.Unmarshal(data, &f) != nil || f.ID == nil || len(*f.ID) > maxIDLen {
		return ""
	}
	return *f.ID
}

// refreshedMessage acknowledges a refresh: its id (omitted when empty: the
// refresh had none) and the new token's expiry (RFC 3339; omitted when it
// has none).
func refreshedMessage(id string, expires time.Time) []byte {
	b := []byte(`{"type":"refreshed"`)
	if id != "" {
		b = append(b, `,"id":`...)
		b = jsonstr.Append(b, id)
	}
	if !expires.IsZero() {
		b = append(b, `,"expires":"`...)
		b = expires.UTC().AppendFormat(b, time.RFC3339)
		b = append(b, '"')
	}
	return append(b, '}')
}

func errorMessage(id, code, msg string) []byte {
	b := []byte(`{"type":"error"`)
	if id != "" {
		b = append(b, `,"id":`...)
		b = jsonstr.Append(b, id)
	}
	b = append(b, `,"code":"`...)
	b = append(b, code...)
	b = append(b, `","message":`...)
	b = jsonstr.Append(b, msg)
	return append(b, '}')
}
