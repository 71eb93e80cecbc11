package filter

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Filter is a subscription's effective filter: its grant's and its own
// where, both of which must accept, with the connection's claims. Equal
// filters (same texts, same claims they name) are one value on the node
// (Set), evaluated once per event for all their subscriptions. It is
// immutable but for Seq and OK.
type Filter struct {
	key    string
	grant  *Expr // nil: the grant filters nothing
	where  *Expr // nil: the subscription filters nothing
	claims map[string]any
	// Index is the equality a view index files the filter under (nil:
	// scanned on every event of its patterns).
	Index *IndexTerm

	// Seq and OK are the dispatcher's: the result for its event Seq,
	// shared by the subscriptions holding the filter. Only the goroutine
	// that dispatches events reads or writes them.
	Seq uint64
	OK  bool
}

// IndexTerm is a filter's equality of a document field (Path) to a
// constant (Key, as ValueKey makes it), its claim resolved.
type IndexTerm struct {
	Path    []string
	PathKey string // Path joined, a map key
	Key     string
}

// New combines a grant's and a subscription's expressions (either
// may be nil) under the connection's claims. Set.Get interns it.
func New(grant, where *Expr, claims map[string]any) *Filter {
	f := &Filter{key: filterKey(grant, where, claims), grant: grant, where: where}
	if (grant != nil && grant.claims) || (where != nil && where.claims) {
		f.claims = claims
	}
	if f.claims == nil {
		f.claims = noClaims
	}
	for _, ce := range []*Expr{grant, where} {
		if ce == nil || f.Index != nil {
			continue
		}
		for _, t := range ce.eqs {
			key := t.key
			if t.claim != nil {
				v, ok := LookupPath(any(claims), t.claim)
				if !ok {
					continue
				}
				if key, ok = ValueKey(v); !ok {
					continue
				}
			}
			f.Index = &IndexTerm{Path: t.path, PathKey: strings.Join(t.path, "\x00"), Key: key}
			break
		}
	}
	return f
}

// filterKey identifies what a filter accepts: its texts and the values of
// the claims they read (all of them, for an expression that reads the
// whole map). Two connections whose tokens differ only in claims the
// filter does not read (exp, iat) share one filter.
func filterKey(grant, where *Expr, claims map[string]any) string {
	var b strings.Builder
	var names []string
	all := false
	for _, ce := range []*Expr{grant, where} {
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

// Grant is the grant's expression (nil: none).
func (f *Filter) Grant() *Expr { return f.grant }

// Where is the subscription's own expression (nil: none).
func (f *Filter) Where() *Expr { return f.where }

// Claims are the claims the filter was made with.
func (f *Filter) Claims() map[string]any { return f.claims }

// Accepts evaluates the filter on one event, without the shared result,
// and says what that cost.
func (f *Filter) Accepts(subject string, p *Parsed) (ok bool, cost uint64) {
	if f == nil {
		return true, 0
	}
	if !p.Valid {
		return false, 0
	}
	ok, _, cost = f.Eval(subject, p)
	return ok, cost
}

// Eval is Accepts, and whether a rejection was an evaluation error.
func (f *Filter) Eval(subject string, p *Parsed) (ok, errored bool, cost uint64) {
	if !p.Valid {
		return false, true, 0
	}
	vars := evalVars{subject: subject, p: p, claims: f.claims}
	for _, ce := range [2]*Expr{f.grant, f.where} {
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

// GrantKey identifies what a subscription's grant filter accepts: its
// text and the values of the claims it reads. A refresh that changes it
// revokes the subscription.
func GrantKey(ce *Expr, claims map[string]any) string {
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
