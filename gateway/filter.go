package gateway

import (
	"encoding/json"
	"sort"
	"strconv"
	"strings"

	"github.com/fanwire/fanwire/subject"
)

// Filters: a subscription's "where" and a grant's, in CEL (the Common
// Expression Language, as Kubernetes and Envoy use it). CEL was chosen
// over a home-made language because its Go implementation is maintained,
// type-checks an expression once, and bounds what one evaluation may cost
// (a runtime cost limit; no loops but bounded macros over lists).
//
// Each distinct expression text is compiled once per node (exprCache).
// Each event's data is parsed once (Event.parsedData), however many
// filters look at it; a filter shared by many subscriptions (the same
// texts and the same claims) is evaluated once per event and its result
// shared (filter.seq). An expression that is, or is a conjunction with,
// an equality of a field of doc to a constant (doc.customer_id == 42, or
// == claims.sub in a grant) is indexed on that field (view.go): an event
// reaches only the subscriptions whose constant is its value.

// filter is a subscription's effective filter: its grant's and its own
// where, both of which must accept, with the connection's claims. Equal
// filters (same texts, same claims they name) are one value on the node
// (filterKey), evaluated once per event for all their subscriptions.
type filter struct {
	key    string
	grant  *compiledExpr // nil: the grant filters nothing
	where  *compiledExpr // nil: the subscription filters nothing
	claims map[string]any
	// index is the equality the view index files the filter under (nil:
	// scanned on every event of its patterns).
	index *indexTerm

	// Owned by the dispatcher: the result for event seq.
	seq uint64
	ok  bool
}

// indexTerm is a filter's equality with its constant resolved.
type indexTerm struct {
	path    []string
	pathKey string
	key     string
}

// newFilter combines a grant's and a subscription's expressions (either
// may be nil) under the connection's claims. Server.filter interns it.
func newFilter(grant, where *compiledExpr, claims map[string]any) *filter {
	f := &filter{key: filterKey(grant, where, claims), grant: grant, where: where}
	if (grant != nil && grant.claims) || (where != nil && where.claims) {
		f.claims = claims
	}
	if f.claims == nil {
		f.claims = noClaims
	}
	for _, ce := range []*compiledExpr{grant, where} {
		if ce == nil || f.index != nil {
			continue
		}
		for _, t := range ce.eqs {
			key := t.key
			if t.claim != nil {
				v, ok := lookupPath(any(claims), t.claim)
				if !ok {
					continue
				}
				if key, ok = valueKey(v); !ok {
					continue
				}
			}
			f.index = &indexTerm{path: t.path, pathKey: strings.Join(t.path, "\x00"), key: key}
			break
		}
	}
	return f
}

// filterKey identifies what a filter accepts: its texts and the values of
// the claims they read (all of them, for an expression that reads the
// whole map). Two connections whose tokens differ only in claims the
// filter does not read (exp, iat) share one filter.
func filterKey(grant, where *compiledExpr, claims map[string]any) string {
	var b strings.Builder
	var names []string
	all := false
	for _, ce := range []*compiledExpr{grant, where} {
		if ce != nil {
			b.WriteString(strconv.Itoa(len(ce.text)))
			b.WriteByte(':')
			b.WriteString(ce.text)
			if ce.claims {
				names = append(names, ce.claimNames...)
				all = all || ce.allClaims
			}
		}
		b.WriteByte(0)
	}
	if all {
		cj, _ := json.Marshal(claims) // sorted keys: equal claims, equal text
		b.Write(cj)
	} else if len(names) > 0 {
		sub := make(map[string]any, len(names))
		for _, n := range names {
			if v, ok := claims[n]; ok {
				sub[n] = v
			}
		}
		cj, _ := json.Marshal(sub)
		b.Write(cj)
	}
	return b.String()
}

var noClaims = map[string]any{}

// accepts evaluates the filter on one event, without the shared result,
// and says what that cost.
func (f *filter) accepts(subject string, p *parsedData) (ok bool, cost uint64) {
	if f == nil {
		return true, 0
	}
	if !p.valid {
		return false, 0
	}
	ok, _, cost = f.eval(subject, p)
	return ok, cost
}

// eval is accepts, and whether a rejection was an evaluation error.
func (f *filter) eval(subject string, p *parsedData) (ok, errored bool, cost uint64) {
	if !p.valid {
		return false, true, 0
	}
	vars := evalVars{subject: subject, p: p, claims: f.claims}
	for _, ce := range [2]*compiledExpr{f.grant, f.where} {
		if ce == nil {
			continue
		}
		ok, errored, c := ce.accepts(&vars)
		cost += c
		if !ok {
			return false, errored, cost
		}
	}
	return true, false, cost
}

// grantFilterText is the filter of the grants covering pattern: "" when
// one covering entry has none (the pattern is granted unfiltered), else the
// disjunction of the covering entries' filters.
func grantFilterText(g *Grants, pattern string) string {
	if g == nil {
		return ""
	}
	var parts []string
	for i, p := range g.Subscribe {
		if !subject.Contains(p, pattern) {
			continue
		}
		w := ""
		if i < len(g.SubscribeWhere) {
			w = g.SubscribeWhere[i]
		}
		if w == "" {
			return ""
		}
		parts = append(parts, w)
	}
	switch len(parts) {
	case 0:
		return ""
	case 1:
		return parts[0]
	}
	sort.Strings(parts)
	parts = compactStrings(parts)
	if len(parts) == 1 {
		return parts[0]
	}
	return "(" + strings.Join(parts, ") || (") + ")"
}

func compactStrings(s []string) []string {
	out := s[:0]
	for i, x := range s {
		if i == 0 || x != s[i-1] {
			out = append(out, x)
		}
	}
	return out
}

// grantKey identifies what a subscription's grant filter accepts: its
// text and the values of the claims it reads. A refresh that changes it
// revokes the subscription.
func grantKey(ce *compiledExpr, claims map[string]any) string {
	if ce == nil {
		return ""
	}
	if !ce.claims {
		return ce.text
	}
	var b []byte
	if ce.allClaims {
		b, _ = json.Marshal(claims)
	} else {
		sub := make(map[string]any, len(ce.claimNames))
		for _, n := range ce.claimNames {
			if v, ok := claims[n]; ok {
				sub[n] = v
			}
		}
		b, _ = json.Marshal(sub)
	}
	return ce.text + "\x00" + string(b)
}
