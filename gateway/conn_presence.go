package gateway

import (
	"encoding/json"
	"errors"
	"strconv"
	"time"
	"unicode/utf8"
)

// The native protocol's presence commands (presence.go): track, untrack
// and members. A subscription with "presence" is subscribe's (conn_commands.go).

// Presence error codes.
const (
	CodeTooManyTracks  = "too_many_tracks"  // track: the connection tracks Config.MaxPresenceTracks subjects already
	CodeTooManyMembers = "too_many_members" // track: the node's replica holds Config.MaxPresenceMembers members (every node's)
)

// track makes the connection a member of subject, or updates its state.
func (c *conn) track(id, subject string, state json.RawMessage, resume string) {
	if !c.presenceRateOK(id) {
		return
	}
	if code, msg := c.s.checkPresenceSubject(subject); code != "" {
		c.clientError(id, code, msg)
		return
	}
	if !c.s.presenceAllowed(c.grants, subject) {
		c.clientError(id, CodeForbidden, c.s.presenceRefusal(c.grants, subject))
		return
	}
	st, err := compactState(state, c.s.cfg.MaxPresenceState)
	switch {
	case errors.Is(err, errStateTooLarge):
		c.clientError(id, CodeTooLarge, "track: \"state\" is over "+strconv.Itoa(c.s.cfg.MaxPresenceState)+" bytes compacted (--max-presence-state)")
		return
	case err != nil:
		c.clientError(id, CodeBadFrame, "track: \"state\": "+err.Error())
		return
	}
	key, secret, refused := c.s.pres.track(c, subject, st, resume, c.s.cfg.MaxPresenceTracks)
	switch refused {
	case CodeTooManyTracks:
		c.clientError(id, refused, "this connection tracks "+strconv.Itoa(c.s.cfg.MaxPresenceTracks)+" subjects already (--max-presence-tracks): untrack one first")
		return
	case CodeTooManyMembers:
		c.clientError(id, refused, "the gateway holds "+strconv.Itoa(c.s.cfg.MaxPresenceMembers)+" presence members, on all its nodes (--max-presence-members): try again later")
		return
	}
	if c.gql == nil {
		c.send(trackedMessage(id, key, secret))
	}
}

// untrack ends the connection's membership of subject. Untracking a
// subject the connection does not track changes nothing and is answered
// the same way: the member is gone either way.
func (c *conn) untrack(id, subject string) {
	if !c.presenceRateOK(id) {
		return
	}
	c.s.pres.untrack(c, subject)
	c.send(c.presenceReply("untracked", id))
}

// members answers one page of subject's members.
func (c *conn) members(id, subject string, after *string, limit *int) {
	if code, msg := c.s.checkPresenceSubject(subject); code != "" {
		c.clientError(id, code, msg)
		return
	}
	if !c.grants.Allows(subject) {
		c.clientError(id, CodeForbidden, "this connection's token does not grant "+strconv.Quote(subject)+": members needs a subscribe grant")
		return
	}
	n := defaultMembersPage
	if limit != nil {
		n = *limit
	}
	ms, count, next := c.s.pres.page(subject, deref(after), n)
	c.send(membersMessage(id, subject, ms, count, next))
}

// trackedMessage is the reply to a track: the member's key, and the
// secret that resumes it from another connection.
func trackedMessage(id, key, secret string) []byte {
	b := append([]byte(`{"type":"tracked","id":`), appendJSONString(nil, id)...)
	b = append(b, `,"member":`...)
	b = appendJSONString(b, key)
	b = append(b, `,"resume":`...)
	b = appendJSONString(b, secret)
	return append(b, '}')
}

// presenceReply is track's or untrack's reply (none in GraphQL, whose
// mutations answer themselves).
func (c *conn) presenceReply(typ, id string) []byte {
	if c.gql != nil {
		return nil
	}
	return replyMessage(typ, id)
}

// presenceRateOK takes a token of the connection's presence rate
// (Config.PresenceRate) or answers rate_limited.
func (c *conn) presenceRateOK(id string) bool {
	if c.presRate.allow(time.Now(), c.s.cfg.PresenceRate) {
		return true
	}
	c.clientError(id, CodeRateLimited, "presence: over "+strconv.Itoa(c.s.cfg.PresenceRate)+" track and untrack messages per second (--presence-rate): dropped; send the newest state again in a second")
	return false
}

// checkPresenceSubject checks a track's or a members request's subject:
// concrete, in the subject space, not a closed system subject.
func (s *Server) checkPresenceSubject(subject string) (code, msg string) {
	if err := ValidateSubject(subject); err != nil {
		return CodeBadSubject, "presence: " + err.Error()
	}
	if err := s.inSubjectSpace(subject); err != nil {
		return CodeBadSubject, "presence: " + err.Error()
	}
	if isSystemSubject(subject) && !s.systemAllowed(subject) {
		return CodeForbidden, "presence: " + strconv.Quote(subject) + " is a system subject (first token $… or _INBOX)"
	}
	return "", ""
}

// presenceAllowed reports whether grants may track on subject: a token's
// presence claim matches it, or (anonymous connections, and gateways
// without authentication) Config.AllowAnonymousPresence and a subscribe
// grant.
func (s *Server) presenceAllowed(g *Grants, subject string) bool {
	if g == nil || g.Anonymous {
		return s.cfg.AllowAnonymousPresence && g.Allows(subject)
	}
	for _, p := range g.Presence {
		if MatchSubject(p, subject) {
			return true
		}
	}
	return false
}

func (s *Server) presenceRefusal(g *Grants, subject string) string {
	if g == nil || g.Anonymous {
		if !s.cfg.AllowAnonymousPresence {
			return "anonymous connections may not track presence (--allow-anonymous-presence is off)"
		}
		return "this connection may not subscribe to " + strconv.Quote(subject) + ", so it may not track there"
	}
	if len(g.Presence) == 0 {
		return "this connection's token has no presence claim: it may not track on " + strconv.Quote(subject)
	}
	return "this connection's token's presence claim does not match " + strconv.Quote(subject)
}

// revokePresence untracks the subjects grants no longer allow (a
// refresh), each with an error revoked.
func (c *conn) revokePresence(grants *Grants) {
	for _, subject := range c.s.pres.tracked(c) {
		if c.s.presenceAllowed(grants, subject) {
			continue
		}
		c.s.pres.untrack(c, subject)
		c.s.metrics.ClientErrors.WithLabelValues(CodeRevoked).Inc()
		if c.gql != nil {
			continue // GraphQL has no error outside an operation; its untrack is the member's leave
		}
		c.send(c.errorMsg("", CodeRevoked, "presence on "+strconv.Quote(subject)+" ended: the refreshed token does not grant it"))
	}
}

// fixUTF8IfNeeded replaces invalid UTF-8 (which encoding/json lets through
// inside strings) as events do.
func fixUTF8IfNeeded(b []byte) []byte {
	if utf8.Valid(b) {
		return b
	}
	return fixUTF8(b)
}
