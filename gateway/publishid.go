package gateway

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"

	"github.com/fanwire/fanwire/broker"
)

// Publish ids are scoped to their publisher. On the brokers that
// deduplicate (JetStream's Nats-Msg-Id, Redis Streams' dedup keys) an id
// is stream-wide: stored as the client sent it, a token allowed only
// chat.u1.> could send the id a service or the ingest is about to use and
// have that event dropped as a duplicate, or (on a subject it may write)
// plant an id the ingest would read as its high-water mark. So the id the
// broker stores is
//
//	"~" <kind> <namespace> "~" <the client's id>
//
// kind is 'k' for an API key, 't' for a token, 'a' for anonymous
// publishers; namespace is 24 base32 characters ([a-z2-7]) of the SHA-256
// of the kind and the identity: the key's name, the token's sub (hashed,
// so the stream's headers do not show who published), nothing for
// anonymous publishers. Every namespace has the same length, so no scoped
// id is another namespace's, nor a prefix of one; and none is an
// ingest's, whose ids start with the writer's name (a replication slot's
// name), which never starts with '~' (broker.ScopedIDMark, checked by
// every Append).
//
// So a repeat of an id drops the event only when the same publisher sent
// it: a key (keys sharing a name share it, as during a rotation), a sub
// (any token for it), or any anonymous publisher (they are one
// publisher: anyone may publish anything there anyway). A token without a
// sub has no identity to scope by: its publishes with an id are refused
// (publish_id_scope); without one they go through.
//
// Subscribers never see ids: an event carries its subject, its cursor (on
// durable brokers, unique per stored event, which is what a consumer
// deduplicating downstream keys on) and its data. A consumer reading the
// stream itself sees the scoped id, stable across a publisher's retries.

// maxPublishIDLen bounds a client's id: it becomes a header and a key.
const maxPublishIDLen = 128

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// idScope is the prefix of the scoped ids of the publisher kind/identity.
func idScope(kind byte, identity string) string {
	h := sha256.New()
	h.Write([]byte{kind, 0})
	h.Write([]byte(identity))
	sum := h.Sum(nil)
	return broker.ScopedIDMark + string(kind) + idEncoding.EncodeToString(sum[:15]) + "~"
}

var anonymousIDScope = idScope('a', "")

func keyIDScope(name string) string { return idScope('k', name) }

func tokenIDScope(sub string) string { return idScope('t', sub) }

// scopedID is the id the broker stores for a publisher's event with the
// client's id ("" for none), or the refusal.
func scopedID(p publisher, id string) (string, *apiError) {
	if id == "" {
		return "", nil
	}
	if len(id) > maxPublishIDLen {
		return "", &apiError{Error: fmt.Sprintf("\"id\": longer than %d bytes", maxPublishIDLen), Code: "bad_request", Field: "id"}
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c >= 0x7f {
			return "", &apiError{Error: fmt.Sprintf("\"id\" %+q: use printable ASCII without spaces", id), Code: "bad_request", Field: "id"}
		}
	}
	if p.idScope == "" {
		return "", &apiError{Error: fmt.Sprintf("%s may not give an \"id\": ids are kept apart per publisher, and a token without a \"sub\" claim names none (publish without an id, or give the token a sub)", p.name), Code: CodeForbidden, Field: "id", Rule: ruleIDScope}
	}
	return p.idScope + id, nil
}
