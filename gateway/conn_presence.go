package gateway

import (
	"encoding/json"
	"errors"
	"strconv"
	"time"

	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/fanwire/fanwire/gateway/internal/presence"
	"github.com/fanwire/fanwire/jsonstr"
	"github.com/fanwire/fanwire/subject"
)

// The native protocol's presence commands (package internal/presence): track, untrack
// and members. A subscription with "presence" is subscribe's (conn_commands.go).

// Presence error codes.
const (
	CodeTooManyTracks  = presence.CodeTooManyTracks  // track: the connection tracks Config.MaxPresenceTracks subjects already
	CodeTooManyMembers = presence.CodeTooManyMembers // track: the node's replica holds Config.MaxPresenceMembers members (every node's)
)

// presenceRefused is a presence command's refusal: the error code and the
// message both protocols send (native: an error message with the
// command's id; GraphQL: the field's error, code in extensions.code).
type presenceRefused struct{ code, msg string }

// track makes the connection a member of subject, or updates its state.
func (c *conn) track(id, subject string, state json.RawMessage, resume string) {
	key, secret, r := c.trackRefused(subject, state, resume)
	if r != nil {
		c.clientError(id, r.code, r.msg)
		return
	}
	c.send(trackedMessage(id, key, secret))
}

// untrack ends the connection's membership of subject. Untracking a
// subject the connection does not track changes nothing and is answered
// the same way: the member is gone either way.
func (c *conn) untrack(id, subject string) {
	if r := c.untrackRefused(subject); r != nil {
		c.clientError(id, r.code, r.msg)
		return
	}
	c.send(replyMessage("untracked", id))
}

// members answers one page of subject's members, within pageBytes: a
// page that could not fit even an empty mailbox (one member over it) is
// refused, not sent (sending it would close the connection).
func (c *conn) members(id, subject string, after *string, limit *int) {
	pg, r := c.s.membersPage(c.grants, subject, after, limit, c.s.pageBytes()-membersOverhead(id, subject))
	if r != nil {
		c.clientError(id, r.code, r.msg)
		return
	}
	b := presence.MembersMessage(id, subject, pg.members, pg.count, pg.next)
	if c.cl.NeverFits(len(b)) && len(pg.members) > 0 { // one member: a state near --max-presence-state in a tiny mailbox
		key := splitMember(pg.members[0]).conn
		c.clientError(id, CodeTooLarge, "members: member "+string(key)+" takes "+strconv.Itoa(len(b))+" bytes with the reply, more than this connection's queue holds (--mailbox-bytes "+
			strconv.Itoa(c.s.cfg.MailboxBytes)+"): raise --mailbox-bytes, or page on with \"after\":"+string(key))
		return
	}
	c.send(b)
}

// maxPageBytes caps pageBytes: a members page or a presence message over
// it buys a client nothing but a longer write (and a frame buffer as big).
const maxPageBytes = 1 << 20

// pageBytes is the most one members reply or presence message takes: a
// quarter of a connection's mailbox (Config.MailboxBytes), so that a
// client reading a page at a time never overflows it, at most
// maxPageBytes. Bigger answers are paged (next) or split.
func (s *Server) pageBytes() int { return min(s.cfg.MailboxBytes/4, maxPageBytes) }

// membersOverhead is what membersMessage adds to its members list and next
// field, at most (a count of 20 digits).
func membersOverhead(id, subject string) int {
	return len(`{"type":"members","id":,"subject":,"count":,"members":[]}`) + jsonstr.Len(id) + jsonstr.Len(subject) + 20
}

// trackRefused runs a track (the native message or the GraphQL mutation)
// of the connection, resuming the member whose secret is resume (""
// none): it returns the member's key and secret, or why not.
func (c *conn) trackRefused(subject string, state json.RawMessage, resume string) (key, secret string, r *presenceRefused) {
	if r := c.presenceRate(); r != nil {
		return "", "", r
	}
	if code, msg := c.s.checkPresenceSubject(subject); code != "" {
		return "", "", &presenceRefused{code, msg}
	}
	if !c.s.presenceAllowed(c.grants, subject) {
		return "", "", &presenceRefused{CodeForbidden, c.s.presenceRefusal(c.grants, subject)}
	}
	st, err := presence.CompactState(state, c.s.cfg.MaxPresenceState)
	switch {
	case errors.Is(err, presence.ErrStateTooLarge):
		return "", "", &presenceRefused{CodeTooLarge, "track: \"state\" is over " + strconv.Itoa(c.s.cfg.MaxPresenceState) + " bytes compacted (--max-presence-state)"}
	case err != nil:
		return "", "", &presenceRefused{CodeBadFrame, "track: \"state\": " + err.Error()}
	}
	sub := "" // the member's sub: its token's, none when anonymous
	if g := c.grants; g != nil && !g.Anonymous {
		sub = g.Subject
	}
	key, secret, refused := c.s.pres.Track(&c.pc, sub, subject, st, resume, c.s.cfg.MaxPresenceTracks)
	switch refused {
	case CodeTooManyTracks:
		return "", "", &presenceRefused{refused, "this connection tracks " + strconv.Itoa(c.s.cfg.MaxPresenceTracks) + " subjects already (--max-presence-tracks): untrack one first"}
	case CodeTooManyMembers:
		return "", "", &presenceRefused{refused, "the gateway holds " + strconv.Itoa(c.s.cfg.MaxPresenceMembers) + " presence members, on all its nodes (--max-presence-members): try again later"}
	}
	return key, secret, nil
}

// untrackRefused runs an untrack of the connection, or says why not (its
// rate only).
func (c *conn) untrackRefused(subject string) *presenceRefused {
	if r := c.presenceRate(); r != nil {
		return r
	}
	c.s.pres.Untrack(&c.pc, subject)
	return nil
}

// memberPage is one page of a subject's members (presence.page).
type memberPage struct {
	members [][]byte
	count   int
	next    string
}

// membersPage is one page of subject's members for grants (a
// connection's, or an HTTP request's), after the key after, at most limit
// (nil: defaultMembersPage) and, past the first member, maxBytes of
// members and next (presence.page), or why not.
func (s *Server) membersPage(g *auth.Grants, subject string, after *string, limit *int, maxBytes int) (memberPage, *presenceRefused) {
	if code, msg := s.checkPresenceSubject(subject); code != "" {
		return memberPage{}, &presenceRefused{code, msg}
	}
	if !g.Allows(subject) {
		return memberPage{}, &presenceRefused{CodeForbidden, "members needs a subscribe grant, and this credential has none for " + strconv.Quote(subject)}
	}
	if msg := presenceFiltered(g, subject); msg != "" {
		return memberPage{}, &presenceRefused{CodeForbidden, "members: " + msg}
	}
	n := defaultMembersPage
	if limit != nil {
		n = *limit
	}
	if n < 1 || n > maxMembersPage {
		return memberPage{}, &presenceRefused{CodeBadFrame, "members: \"limit\" must be 1 to " + strconv.Itoa(maxMembersPage)}
	}
	var pg memberPage
	pg.members, pg.count, pg.next = s.pres.Page(subject, deref(after), n, maxBytes)
	return pg, nil
}

// trackedMessage is the reply to a track: the member's key, and the
// secret that resumes it from another connection.
func trackedMessage(id, key, secret string) []byte {
	b := append([]byte(`{"type":"tracked","id":`), jsonstr.Append(nil, id)...)
	b = append(b, `,"member":`...)
	b = jsonstr.Append(b, key)
	b = append(b, `,"resume":`...)
	b = jsonstr.Append(b, secret)
	return append(b, '}')
}

// presenceRate takes a token of the connection's presence rate
// (Config.PresenceRate), or refuses with rate_limited.
func (c *conn) presenceRate() *presenceRefused {
	if c.presRate.allow(time.Now(), c.s.cfg.PresenceRate) {
		return nil
	}
	return &presenceRefused{CodeRateLimited, "presence: over " + strconv.Itoa(c.s.cfg.PresenceRate) + " track and untrack messages per second (--presence-rate): dropped; send the newest state again in a second"}
}

// checkPresenceSubject checks a track's or a members request's subject:
// concrete, in the subject space, not a closed system subject.
func (s *Server) checkPresenceSubject(subj string) (code, msg string) {
	if err := subject.Validate(subj); err != nil {
		return CodeBadSubject, "presence: " + err.Error()
	}
	if err := s.inSubjectSpace(subj); err != nil {
		return CodeBadSubject, "presence: " + err.Error()
	}
	if subject.IsSystem(subj) && !s.systemAllowed(subj) {
		return CodeForbidden, "presence: " + strconv.Quote(subj) + " is a system subject (first token $… or _INBOX)"
	}
	return "", ""
}

// presenceAllowed reports whether grants may track on subject: a token's
// presence claim matches it, or (anonymous connections, and gateways
// without authentication) Config.AllowAnonymousPresence and a subscribe
// grant.
func (s *Server) presenceAllowed(g *auth.Grants, subj string) bool {
	if g == nil || g.Anonymous {
		return s.cfg.AllowAnonymousPresence && g.Allows(subj) && presenceFiltered(g, subj) == ""
	}
	for _, p := range g.Presence {
		if subject.Match(p, subj) {
			return true
		}
	}
	return false
}

func (s *Server) presenceRefusal(g *auth.Grants, subject string) string {
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

// presenceFiltered says why grants see no presence on pattern ("" when
// they do): a row filter of theirs covers it. Presence has no rows to
// filter: a member of db.orders.99 shows who is at order 99, which a
// grant that hides that order's row must hide too. Filtering members by
// the row would need the subject's current document at every presence
// change and every members page, which the node does not keep; so a
// filtered grant gives no presence (members, watches), on every
// protocol.
func presenceFiltered(g *auth.Grants, pattern string) string {
	if auth.FilterText(g, pattern) == "" {
		return ""
	}
	return "this credential's subscribe grant on " + strconv.Quote(pattern) + " filters rows (a row-level grant), and presence is not filtered by rows: it needs an unfiltered subscribe grant there"
}

// revokePresence untracks the subjects grants no longer allow (a
// refresh), each with an error revoked.
func (c *conn) revokePresence(grants *auth.Grants) {
	for _, subject := range c.s.pres.Tracked(&c.pc) {
		if c.s.presenceAllowed(grants, subject) {
			continue
		}
		c.s.pres.Untrack(&c.pc, subject)
		c.s.metrics.ClientErrors.WithLabelValues(CodeRevoked).Inc()
		if c.gql != nil {
			continue // GraphQL has no error outside an operation; its untrack is the member's leave
		}
		c.send(c.errorMsg("", CodeRevoked, "presence on "+strconv.Quote(subject)+" ended: the refreshed token does not grant it"))
	}
}
