package gateway

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/fanwire/fanwire/gateway/auth"
	"github.com/fanwire/fanwire/subject"
)

// Who may publish where. Every publish (POST /api/publish, a native
// client's publish message, the GraphQL publish mutation) goes through
// checkPublish with its publisher: an API key, a token's publish grants,
// or an anonymous publisher (Config.AllowAnonymousPublish). The rules, in
// the order they are checked:
//
// Subject syntax. A subject is concrete NATS syntax, valid UTF-8 without
// control, format (zero-width, bidirectional), space or separator
// characters nor U+FFFD (subject.Validate): nothing invisible can make a
// subject look like another one. Subscriptions' patterns follow the same
// rule.
//
// System subjects. A subject whose first token starts with '$' ($JS, $KV,
// $SYS: the NATS server's APIs) or is _INBOX (request replies) is closed:
// publishing there would use the gateway's own broker credentials. Only
// the patterns of Config.AllowSystemSubjects (--allow-system-subjects)
// open, and there only for a publish pattern that names the first token
// (no key without patterns, no anonymous publisher, no pattern such as
// ">" or "*.x"): a wildcard never reaches a system subject, for publish
// as for delivery (system.go).
//
// The reserved-subject rule. A subject matching a pattern of
// Config.ReservedSubjects (default db.>, the ingest's events) may be
// published to only by a publisher with a publish pattern P that matches
// the subject and that names the reserved space explicitly: every subject
// P matches is reserved (subject.Contains(reserved, P)). So an API key limited to
// db.audit.> may write db.audit.1, but a key without patterns (anywhere),
// a pattern such as ">" or "*.orders.>" (which reach beyond the reserved
// space) and an anonymous publisher never may. Widening a credential to
// everything never grants the ingest's subjects by accident; granting them
// is a deliberate, visible pattern. Two details keep that exact:
//
//   - The comparison folds case and width: DB.orders.1 and a full-width
//     "ｄｂ.orders.1" are reserved under db.>, since a consumer or a reader
//     could take them for the ingest's (subject.FoldContains). The publish pattern
//     must still match the subject byte for byte, so a key for db.audit.>
//     may not write DB.audit.1.
//   - A token's pattern names the reserved space as the issuer wrote it,
//     before {claim} placeholders are substituted, each placeholder token
//     counting as '*': "db.{tenant}.>" names db.> (db.*.> lies inside it)
//     and may write db.acme.x for tenant acme; "{tenant}.orders.>" does
//     not, even for a token whose tenant claim is "db".
//
// Publish ids. An event's "id" (POST /api/publish) is stored scoped to its
// publisher (publishid.go): it deduplicates a publisher's own retries,
// never another publisher's events nor the ingest's.

// publisher is the credential a publish comes with.
type publisher struct {
	name     string   // for refusals: `API key "orders"`, `token of "u1"`, "anonymous publishers"
	anywhere bool     // no patterns: any subject outside the reserved and system ones
	patterns []string // where it may publish, when !anywhere
	written  []string // patterns as written, before claims were substituted (see writtenAt)
	idScope  string   // the prefix of its scoped ids (publishid.go); "": it may not give ids
}

// anonymousPublisher publishes without a credential.
var anonymousPublisher = publisher{name: "anonymous publishers (--allow-anonymous-publish)", anywhere: true, idScope: anonymousIDScope}

func keyPublisher(k *APIKey) publisher {
	return publisher{name: "API key " + strconv.Quote(k.Name), anywhere: len(k.Publish) == 0, patterns: k.Publish, written: k.Publish, idScope: keyIDScope(k.Name)}
}

// grantsPublisher is the publisher of a connection or a request with
// grants (nil or anonymous: anonymous, when allowed).
func (s *Server) grantsPublisher(g *auth.Grants) (publisher, bool) {
	if g == nil || g.Anonymous {
		return anonymousPublisher, s.cfg.AllowAnonymousPublish
	}
	p := publisher{name: "this token", patterns: g.Publish, written: g.PublishAsWritten}
	if g.Subject != "" {
		p.name = "the token of " + strconv.Quote(g.Subject)
		p.idScope = tokenIDScope(g.Subject)
	}
	return p, true
}

// writtenAt is the i-th pattern as written (the pattern itself when the
// credential keeps no written form).
func (p *publisher) writtenAt(i int) string {
	if len(p.written) == len(p.patterns) {
		return p.written[i]
	}
	return p.patterns[i]
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
	ruleSystem       = "system_subjects"   // a $… or _INBOX subject: Config.AllowSystemSubjects
	ruleIDScope      = "publish_id_scope"  // an id from a publisher without a namespace (a token without sub)
)

// publishRefusal says why a publish was refused: a code of errors.go, the
// rule that refused it, and a message naming the subject.
type publishRefusal struct {
	code, rule, msg string
}

func (r *publishRefusal) Error() string { return r.msg }

// checkPublish reports whether p may publish to subject, and why not.
func (s *Server) checkPublish(p publisher, subj string) *publishRefusal {
	if err := subject.Validate(subj); err != nil {
		return &publishRefusal{CodeBadSubject, ruleSyntax, err.Error()}
	}
	if err := s.inSubjectSpace(subj); err != nil {
		return &publishRefusal{CodeBadSubject, ruleSubjectSpace, err.Error()}
	}
	system := subject.IsSystem(subj)
	if system && !s.systemAllowed(subj) {
		return &publishRefusal{CodeForbidden, ruleSystem, fmt.Sprintf("subject %q is a system subject (first token $… or _INBOX: the NATS server's APIs and replies): closed unless --allow-system-subjects opens it", subj)}
	}
	if !p.anywhere && len(p.patterns) == 0 {
		return &publishRefusal{CodeForbidden, ruleNoPublish, fmt.Sprintf("%s grants no publishing (no publish claim): may not publish to %q", p.name, subj)}
	}
	if r := s.reservedFor(subj); r != "" {
		for i, pat := range p.patterns {
			if subject.Match(pat, subj) && subject.FoldContains(r, p.writtenAt(i)) {
				return nil
			}
		}
		return &publishRefusal{CodeForbidden, ruleReserved, fmt.Sprintf("subject %q is reserved (--reserved-subjects %s, compared ignoring case): only a key or token with a publish pattern that matches it exactly and lies inside %s as written, before {claim} placeholders are substituted, may publish there, not %s", subj, strings.Join(s.cfg.ReservedSubjects, ","), r, p.name)}
	}
	if system {
		for _, pat := range p.patterns {
			if subject.MatchEvent(pat, subj) {
				return nil
			}
		}
		return &publishRefusal{CodeForbidden, ruleSystem, fmt.Sprintf("subject %q is a system subject opened by --allow-system-subjects: only a publish pattern that names its first token may publish there, not %s", subj, p.name)}
	}
	if p.anywhere {
		return nil
	}
	for _, pat := range p.patterns {
		if subject.Match(pat, subj) {
			return nil
		}
	}
	return &publishRefusal{CodeForbidden, rulePatterns, fmt.Sprintf("%s may not publish to %q (outside its publish patterns)", p.name, subj)}
}

// reservedFor returns the reserved pattern subject matches, folded ("" for
// none).
func (s *Server) reservedFor(subj string) string {
	for _, r := range s.cfg.ReservedSubjects {
		if subject.FoldMatch(r, subj) {
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
