package gateway

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"path"
	"strings"
	"time"

	"github.com/fanwire/fanwire/broker"
	"go.uber.org/zap"
)

// publishRequest is one event of POST /api/publish.
type publishRequest struct {
	Subject *string         `json:"subject"`
	Data    json.RawMessage `json:"data"`
	ID      string          `json:"id,omitempty"`
}

var publishFields = []string{"subject", "data", "id"}

// maxPublishBatch bounds the events of one request.
const maxPublishBatch = 10_000

// publishTimeout bounds the broker round-trip of one request.
const publishTimeout = 10 * time.Second

// servePublish publishes one event or an array of them into the broker, so
// every gateway node on that broker delivers them. It is all or nothing for
// validation: one bad event rejects the request and names it.
func (s *Server) servePublish(w http.ResponseWriter, r *http.Request) {
	pub, status, aerr := s.httpPublisher(r)
	if aerr != nil {
		if status == http.StatusUnauthorized {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fanwire"`)
		}
		s.publishError(w, status, *aerr)
		return
	}
	// The body is parsed as JSON whatever its Content-Type says (curl -d
	// sends form encoding). A browser on another site can still send a
	// "simple" cross-origin POST without a preflight, so a request that
	// carries a foreign Origin is refused: the same allow-list as /ws.
	if origin := r.Header.Get("Origin"); origin != "" && !s.originAllowed(origin, r.Host) {
		s.publishError(w, http.StatusForbidden, apiError{Error: "origin " + origin + " is not allowed (see --allowed-origins)", Code: "forbidden_origin"})
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxPublishBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			s.publishError(w, http.StatusRequestEntityTooLarge, apiError{Error: fmt.Sprintf("request body over %d bytes", s.cfg.MaxPublishBytes), Code: "too_large"})
			return
		}
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() { // see HTTPServer
			s.publishError(w, http.StatusRequestTimeout, apiError{Error: "request body not received within " + s.cfg.HandshakeTimeout.String() + " (--handshake-timeout)", Code: "body_timeout"})
			return
		}
		s.publishError(w, http.StatusBadRequest, apiError{Error: "read body: " + err.Error(), Code: "bad_request"})
		return
	}
	msgs, aerr := s.parsePublish(body, pub)
	if aerr != nil {
		status := http.StatusBadRequest
		switch aerr.Code {
		case "forbidden":
			status = http.StatusForbidden
		case CodeTooLarge:
			status = http.StatusRequestEntityTooLarge
		}
		s.publishError(w, status, *aerr)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), publishTimeout)
	defer cancel()
	cursors, err := s.cfg.Broker.Publish(ctx, msgs)
	if err != nil {
		s.metrics.PublishRequests.WithLabelValues("broker_error").Inc()
		s.log.Warn("publish failed", zap.Error(err), zap.Int("events", len(msgs)))
		writeJSON(w, http.StatusServiceUnavailable, apiError{Error: "broker: " + err.Error(), Code: "broker_unavailable"})
		return
	}
	s.metrics.PublishRequests.WithLabelValues("ok").Inc()
	s.metrics.PublishedEvents.Add(float64(len(msgs)))
	resp := struct {
		Published int      `json:"published"`
		Cursors   []string `json:"cursors,omitempty"`
	}{Published: len(msgs)}
	for _, c := range cursors {
		if c != "" {
			resp.Cursors = cursors
			break
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

// publishError answers a refused publish; the metric counts it by its
// code (a fixed set: publish_disabled, unauthorized, bad_request,
// bad_subject, forbidden, forbidden_origin, too_large, body_timeout).
// Which rule refused a forbidden publish is in the answer's "rule".
func (s *Server) publishError(w http.ResponseWriter, status int, e apiError) {
	s.metrics.PublishRequests.WithLabelValues(e.Code).Inc()
	writeJSON(w, status, e)
}

// parsePublish accepts {"subject":…,"data":…} or an array of them.
func (s *Server) parsePublish(body []byte, pub publisher) ([]broker.Outgoing, *apiError) {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return nil, &apiError{Error: "empty body: send {\"subject\":…,\"data\":…} or an array of them", Code: "bad_request"}
	}
	var reqs []publishRequest
	if trimmed[0] == '[' {
		var raws []json.RawMessage
		if err := json.Unmarshal(trimmed, &raws); err != nil {
			return nil, &apiError{Error: "invalid JSON: " + jsonErrorText(err), Code: "bad_request"}
		}
		if len(raws) == 0 {
			return nil, &apiError{Error: "empty array: nothing to publish", Code: "bad_request"}
		}
		if len(raws) > maxPublishBatch {
			return nil, &apiError{Error: fmt.Sprintf("at most %d events per request", maxPublishBatch), Code: "bad_request"}
		}
		reqs = make([]publishRequest, len(raws))
		for i, raw := range raws {
			if err := decodeObject(raw, &reqs[i], publishFields...); err != nil {
				return nil, &apiError{Error: "invalid event: " + err.Error(), Code: "bad_request", Index: &i}
			}
		}
	} else {
		reqs = make([]publishRequest, 1)
		if err := decodeObject(trimmed, &reqs[0], publishFields...); err != nil {
			return nil, &apiError{Error: "invalid event: " + err.Error(), Code: "bad_request"}
		}
	}
	msgs := make([]broker.Outgoing, len(reqs))
	for i, q := range reqs {
		idx := &i
		if len(reqs) == 1 && trimmed[0] != '[' {
			idx = nil
		}
		switch {
		case q.Subject == nil:
			return nil, &apiError{Error: "\"subject\" is required", Code: "bad_request", Field: "subject", Index: idx}
		case q.Data == nil:
			return nil, &apiError{Error: "\"data\" is required (any JSON value)", Code: "bad_request", Field: "data", Index: idx}
		}
		if ref := s.checkPublish(pub, *q.Subject); ref != nil {
			return nil, &apiError{Error: ref.msg, Code: ref.code, Field: "subject", Index: idx, Subject: *q.Subject, Rule: ref.rule}
		}
		var data bytes.Buffer
		if err := json.Compact(&data, q.Data); err != nil {
			return nil, &apiError{Error: "\"data\": " + jsonErrorText(err), Code: "bad_request", Field: "data", Index: idx}
		}
		if msg := s.overMailbox(*q.Subject, data.Len()); msg != "" {
			return nil, &apiError{Error: msg, Code: CodeTooLarge, Field: "data", Index: idx, Subject: *q.Subject, Rule: ruleMailbox}
		}
		id, aerr := scopedID(pub, q.ID)
		if aerr != nil {
			aerr.Index = idx
			return nil, aerr
		}
		msgs[i] = broker.Outgoing{Subject: *q.Subject, Data: data.Bytes(), ID: id}
	}
	return msgs, nil
}

// originAllowed reports whether a browser Origin is this host or matches
// one of AllowedOrigins (host patterns, as for /ws).
func (s *Server) originAllowed(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" {
		return false
	}
	if strings.EqualFold(u.Host, host) {
		return true
	}
	for _, p := range s.cfg.AllowedOrigins {
		if ok, _ := path.Match(strings.ToLower(p), strings.ToLower(u.Host)); ok {
			return true
		}
	}
	return false
}

// APIKey is a key for POST /api/publish: a name (for errors and logs; the
// key itself is never logged) and the subject patterns it may publish to
// (none: every subject but the reserved ones; see publishauth.go).
type APIKey struct {
	Name    string
	Key     string
	Publish []string
}

// httpPublisher finds the credential of a publish over HTTP (POST
// /api/publish, the GraphQL publish mutation): an API key, compared with
// every key in constant time; else a token, when PublishTokens; without an
// Authorization header, an anonymous publisher when AllowAnonymousPublish.
// Otherwise it returns the refusal: 403 publish_disabled when no credential
// is configured at all (naming the flags), 401 unauthorized for a missing
// or wrong one. With no credential configured, a header is ignored.
func (s *Server) httpPublisher(r *http.Request) (publisher, int, *apiError) {
	if !s.PublishEnabled() {
		return publisher{}, http.StatusForbidden, &apiError{Error: publishDisabledText, Code: CodePublishDisabled}
	}
	header := r.Header.Get("Authorization")
	if header == "" || !s.publishCredentials() {
		if s.cfg.AllowAnonymousPublish {
			return anonymousPublisher, 0, nil
		}
		return publisher{}, http.StatusUnauthorized, &apiError{Error: "missing credential: send Authorization: Bearer <API key" + s.orToken() + ">", Code: "unauthorized"}
	}
	var key *APIKey
	for i := range s.cfg.APIKeys {
		if bearerMatches(header, s.cfg.APIKeys[i].Key) && key == nil {
			key = &s.cfg.APIKeys[i]
		}
	}
	if key != nil {
		return keyPublisher(key), 0, nil
	}
	if s.cfg.PublishTokens {
		if _, ok := cutBearer(header); ok {
			g, err := s.cfg.Authenticate(r.Context(), r, nil)
			if err == nil && g != nil && !g.Anonymous {
				pub, _ := s.grantsPublisher(g)
				return pub, 0, nil
			}
			msg := "neither an API key nor a valid token"
			if err != nil {
				msg = "not an API key, and " + err.Error()
			}
			return publisher{}, http.StatusUnauthorized, &apiError{Error: "wrong credential: " + msg, Code: "unauthorized"}
		}
	}
	return publisher{}, http.StatusUnauthorized, &apiError{Error: "missing or wrong API key (Authorization: Bearer <key" + s.orToken() + ">)", Code: "unauthorized"}
}

func (s *Server) orToken() string {
	if s.cfg.PublishTokens {
		return " or token"
	}
	return ""
}

// cutBearer returns the credential of an "Authorization: Bearer" header.
func cutBearer(header string) (string, bool) {
	const prefix = "Bearer "
	if len(header) < len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return "", false
	}
	return strings.TrimSpace(header[len(prefix):]), true
}

// bearerMatches compares the bearer token with key in constant time.
func bearerMatches(header, key string) bool {
	const prefix = "Bearer "
	if len(header) < len(prefix) || !strings.EqualFold(header[:len(prefix)], prefix) {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(header[len(prefix):]), []byte(key)) == 1
}
