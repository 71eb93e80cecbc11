package gateway

import (
	"fmt"
	"strconv"
	"strings"
)

// Who may publish where. Every publish (POST /api/publish, a native
// client's publish message, the GraphQL publish mutation) goes through
// checkPublish with its publisher: an API key, a token's publish grants,
// or an anonymous publisher (Config.AllowAnonymousPublish).
//
// The reserved-subject rule: a subject matching a pattern of
// Config.ReservedSubjects (default db.>, the ingest's events) may be
// published to only by a publisher with a publish pattern P that matches
// the subject and that names the reserved space explicitly: every subject
// P matches is reserved (Contains(reserved, P)). So an API key limited to
// db.audit.> may write db.audit.1, and a token granted "db.{tenant}.>" may
// write db.acme.x, but a key without patterns (anywhere), a pattern such
// as ">" or "*.orders.>" (which reach beyond the reserved space) and an
// anonymous publisher never may. Widening a credential to everything never
// grants the ingest's subjects by accident; granting them is a deliberate,
// visible pattern.

// publisher is the credential a publish comes with.
type publisher struct {
	name     string   // for refusals: `API key "orders"`, `token of "u1"`, "anonymous publishers"
	anywhere bool     // no patterns: any subject outside the reserved ones
	patterns []string // where it may publish, when !anywhere
}

// anonymousPublisher publishes without a credential.
var anonymousPublisher = publisher{name: "anonymous publishers (--allow-anonymous-publish)", anywhere: true}

func keyPublisher(k *APIKey) publisher {
	return publisher{name: "API key " + strconv.Quote(k.Name), anywhere: len(k.Publish) == 0, patterns: k.Publish}
}

// grantsPublisher is the publisher of a connection or a request with
// grants (nil or anonymous: anonymous, when allowed).
func (s *Server) grantsPublisher(g *Grants) (publisher, bool) {
	if g == nil || g.Anonymous {
		return anonymousPublisher, s.cfg.AllowAnonymousPublish
	}
	name := "this token"
	if g.Subject != "" {
		name = "the token of " + strconv.Quote(g.Subject)
	}
	return publisher{name: name, patterns: g.Publish}, true
}

// Rules a refusal names.
const (
	ruleSyntax       = "subject_syntax"    // not a valid concrete subject
	ruleSubjectSpace = "subject_space"     // outside Config.Subjects
	ruleReserved     = "reserved_subjects" // Config.ReservedSubjects
	rulePatterns     = "publish_patterns"  // the key's patterns or the token's publish claim
	ruleNoPublish    = "no_publish_grant"  // a connection or token without a publish grant
	ruleSize         = "max_publish_bytes" // Config.MaxPublishBytes or the broker's limit
	ruleMailbox      = "mailbox_bytes"     // Config.MailboxBytes: the event would not fit in a connection's queue
)

// publishRefusal says why a publish was refused: a code of errors.go, the
// rule that refused it, and a message naming the subject.
type publishRefusal struct {
	code, rule, msg string
}

func (r *publishRefusal) Error() string { return r.msg }

// checkPublish reports whether p may publish to subject, and why not.
func (s *Server) checkPublish(p publisher, subject string) *publishRefusal {
	if err := ValidateSubject(subject); err != nil {
		return &publishRefusal{CodeBadSubject, ruleSyntax, err.Error()}
	}
	if err := s.inSubjectSpace(subject); err != nil {
		return &publishRefusal{CodeBadSubject, ruleSubjectSpace, err.Error()}
	}
	if !p.anywhere && len(p.patterns) == 0 {
		return &publishRefusal{CodeForbidden, ruleNoPublish, fmt.Sprintf("%s grants no publishing (no publish claim): may not publish to %q", p.name, subject)}
	}
	if r := s.reservedFor(subject); r != "" {
		for _, pat := range p.patterns {
			if MatchSubject(pat, subject) && Contains(r, pat) {
				return nil
			}
		}
		return &publishRefusal{CodeForbidden, ruleReserved, fmt.Sprintf("subject %q is reserved (--reserved-subjects %s): only a key or token with a publish pattern inside %s that matches it may publish there, not %s", subject, strings.Join(s.cfg.ReservedSubjects, ","), r, p.name)}
	}
	if p.anywhere {
		return nil
	}
	for _, pat := range p.patterns {
		if MatchSubject(pat, subject) {
			return nil
		}
	}
	return &publishRefusal{CodeForbidden, rulePatterns, fmt.Sprintf("%s may not publish to %q (outside its publish patterns)", p.name, subject)}
}

// reservedFor returns the reserved pattern subject matches ("" for none).
func (s *Server) reservedFor(subject string) string {
	for _, r := range s.cfg.ReservedSubjects {
		if MatchSubject(r, subject) {
			return r
		}
	}
	return ""
}

// PublishEnabled reports whether POST /api/publish may publish at all: a
// publish credential is configured (APIKeys, PublishTokens) or
// AllowAnonymousPublish is set.
func (s *Server) PublishEnabled() bool {
	return s.publishCredentials() || s.cfg.AllowAnonymousPublish
}

func (s *Server) publishCredentials() bool { return len(s.cfg.APIKeys) > 0 || s.cfg.PublishTokens }

// publishDisabledText names the flags that open POST /api/publish.
const publishDisabledText = "publishing is off on this gateway: start it with --api-key, --api-keys-file, or a JWT key (--jwt-secret-file, --jwt-jwks-file) whose tokens carry a publish claim; or with --allow-anonymous-publish to let anyone who reaches it publish"
