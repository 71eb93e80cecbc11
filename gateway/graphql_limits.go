package gateway

import (
	"context"
	"fmt"
	"strconv"

	"github.com/99designs/gqlgen/graphql"
	"github.com/99designs/gqlgen/graphql/errcode"
	"github.com/vektah/gqlparser/v2/ast"
	"github.com/vektah/gqlparser/v2/gqlerror"
	"github.com/vektah/gqlparser/v2/lexer"
	"github.com/vektah/gqlparser/v2/parser"
)

// Bounds on a GraphQL operation, checked before gqlgen validates it: the
// query's bytes, its tokens, the depth of its fields, its aliases and its
// complexity. Parsing is linear in the query, validation is not: its
// overlapping-fields rule compares every pair of fields that share a
// response name in one selection set and builds an error for each pair that
// conflicts. 4,000 repeats of `a:health{status} a:subscribable{broker}`
// (160 KB) made 16M errors, allocated 4.8 GiB and ran for minutes; 100
// repeats of a plain `health{status}` allocate 0.35 MiB, 1,000 of them
// 24 MiB.
//
// gqlLimits is a gqlgen handler extension, used by both the HTTP handler
// (GET and POST) and the executor of WebSocket operations (both
// subprotocols): one check for every transport. Its parameter mutator runs
// before gqlgen parses; a refusal is a GraphQL error with extensions
// code query_limit, the limit's flag and its value.

func init() {
	// A refusal is a request error: 422 over HTTP (400 with
	// application/graphql-response+json), like a validation error.
	errcode.RegisterErrorType(CodeQueryLimit, errcode.KindProtocol)
}

// gqlLimits is the handler extension enforcing the query limits; static
// after newGraphQL.
type gqlLimits struct {
	s     *Server
	bytes int // Config.GraphQLMaxQueryBytes; < 0: no limit (also below)
	toks  int // Config.GraphQLMaxTokens
	depth int // Config.GraphQLMaxDepth
	alias int // Config.GraphQLMaxAliases
	cost  int // Config.GraphQLMaxComplexity
}

var (
	_ graphql.HandlerExtension          = (*gqlLimits)(nil)
	_ graphql.OperationParameterMutator = (*gqlLimits)(nil)
	_ graphql.OperationContextMutator   = (*gqlLimits)(nil)
)

func (l *gqlLimits) ExtensionName() string                   { return "FanwireQueryLimits" }
func (l *gqlLimits) Validate(graphql.ExecutableSchema) error { return nil }

func newGQLLimits(s *Server) *gqlLimits {
	c := &s.cfg
	return &gqlLimits{s: s, bytes: c.GraphQLMaxQueryBytes, toks: c.GraphQLMaxTokens, depth: c.GraphQLMaxDepth, alias: c.GraphQLMaxAliases, cost: c.GraphQLMaxComplexity}
}

// Limit names: extensions.limit of a refusal and the label of
// fanwire_graphql_refused_total.
const (
	limitBody       = "body"
	limitBytes      = "bytes"
	limitTokens     = "tokens"
	limitDepth      = "depth"
	limitAliases    = "aliases"
	limitComplexity = "complexity"
	limitPublishes  = "publishes"
)

// refuse counts and builds the refusal of limit (its flag, its value) with
// msg.
func (l *gqlLimits) refuse(limit, flag string, max int, msg string) *gqlerror.Error {
	l.s.metrics.GraphQLRefused.WithLabelValues(limit).Inc()
	return &gqlerror.Error{
		Message:    msg + " (--" + flag + ")",
		Extensions: map[string]any{"code": CodeQueryLimit, "limit": limit, "max": max},
	}
}

// MutateOperationParameters checks the raw query before gqlgen parses and
// validates it. A query that does not parse passes: gqlgen reports its
// syntax error as usual, after parsing it with the same token bound.
func (l *gqlLimits) MutateOperationParameters(ctx context.Context, p *graphql.RawParams) *gqlerror.Error {
	q := p.Query
	if l.bytes >= 0 && len(q) > l.bytes {
		return l.refuse(limitBytes, "graphql-max-query-bytes", l.bytes,
			fmt.Sprintf("query of %d bytes: over the %d bytes a query may have", len(q), l.bytes))
	}
	if l.toks < 0 && l.alias < 0 && l.depth < 0 && l.cost < 0 {
		return nil
	}
	src := &ast.Source{Input: q}
	doc, err := parser.ParseQueryWithTokenLimit(src, max(l.toks, 0))
	if err != nil {
		if l.toks >= 0 && overTokens(src, l.toks) {
			return l.refuse(limitTokens, "graphql-max-tokens", l.toks,
				"query over the "+strconv.Itoa(l.toks)+" tokens (names, punctuation, values) a query may have")
		}
		return nil
	}
	if l.alias >= 0 {
		n := 0
		for _, op := range doc.Operations {
			n += countAliases(op.SelectionSet)
		}
		for _, f := range doc.Fragments {
			n += countAliases(f.SelectionSet)
		}
		if n > l.alias {
			return l.refuse(limitAliases, "graphql-max-aliases", l.alias,
				fmt.Sprintf("query with %d aliases: over the %d a query may have", n, l.alias))
		}
	}
	if l.depth < 0 && l.cost < 0 {
		return nil
	}
	w := shapeWalker{l: l, frags: make(map[string]*ast.FragmentDefinition, len(doc.Fragments)), active: map[string]bool{}, spread: map[string]bool{}}
	for _, f := range doc.Fragments {
		if _, dup := w.frags[f.Name]; !dup { // a duplicate name is validation's to report
			w.frags[f.Name] = f
		}
	}
	for _, op := range doc.Operations {
		if e := w.walk([]ast.SelectionSet{op.SelectionSet}, 1); e != nil {
			return e
		}
	}
	// Validation also checks fragments on their own: those no operation
	// spreads are walked as roots.
	for _, f := range doc.Fragments {
		if !w.spread[f.Name] {
			if e := w.walk([]ast.SelectionSet{f.SelectionSet}, 1); e != nil {
				return e
			}
		}
	}
	return nil
}

// overTokens reports whether src has more than max tokens (lexing stops at
// the first token over it, or at a lexical error).
func overTokens(src *ast.Source, max int) bool {
	lx := lexer.New(src)
	for n := 0; ; n++ {
		tok, err := lx.ReadToken()
		if err != nil || tok.Kind == lexer.EOF {
			return false
		}
		if n >= max {
			return true
		}
	}
}

// countAliases counts the aliased fields of set as written (fragments
// are counted once, where they are defined).
func countAliases(set ast.SelectionSet) int {
	n := 0
	for _, sel := range set {
		switch sel := sel.(type) {
		case *ast.Field:
			if sel.Alias != "" && sel.Alias != sel.Name {
				n++
			}
			n += countAliases(sel.SelectionSet)
		case *ast.InlineFragment:
			n += countAliases(sel.SelectionSet)
		}
	}
	return n
}

// shapeWalker measures an operation's depth and complexity as execution
// would see it: fragments expanded where they are spread, and the fields
// that share a response name merged, their selections together. The
// complexity is the number of fields so selected plus one for each pair of
// them sharing a response name in one selection set: the pairs validation
// compares (gqlgen's own complexity, one per field, comes after
// validation). The walk stops as soon as a limit is crossed, so its own
// cost is bounded by them.
type shapeWalker struct {
	l      *gqlLimits
	frags  map[string]*ast.FragmentDefinition
	active map[string]bool // fragments being expanded: a cycle is validation's to report
	spread map[string]bool // fragments some operation spreads
	cost   int
}

// respGroup is the fields of one selection set with one response name.
type respGroup struct {
	fields []*ast.Field
}

// walk walks the merged selection sets sets, whose fields are at depth.
func (w *shapeWalker) walk(sets []ast.SelectionSet, depth int) *gqlerror.Error {
	var groups []respGroup
	index := map[string]int{}
	for _, set := range sets {
		if e := w.collect(set, &groups, index); e != nil {
			return e
		}
	}
	if len(groups) == 0 {
		return nil
	}
	if l := w.l; l.depth >= 0 && depth > l.depth {
		return l.refuse(limitDepth, "graphql-max-depth", l.depth,
			"query with fields nested over "+strconv.Itoa(l.depth)+" deep")
	}
	for _, g := range groups {
		k := len(g.fields)
		if e := w.add(k * (k - 1) / 2); e != nil {
			return e
		}
	}
	for _, g := range groups {
		var sub []ast.SelectionSet
		for _, f := range g.fields {
			if len(f.SelectionSet) > 0 {
				sub = append(sub, f.SelectionSet)
			}
		}
		if len(sub) > 0 {
			if e := w.walk(sub, depth+1); e != nil {
				return e
			}
		}
	}
	return nil
}

// collect adds the fields of set, through inline fragments and spreads, to
// groups by response name.
func (w *shapeWalker) collect(set ast.SelectionSet, groups *[]respGroup, index map[string]int) *gqlerror.Error {
	for _, sel := range set {
		switch sel := sel.(type) {
		case *ast.Field:
			if e := w.add(1); e != nil {
				return e
			}
			name := sel.Alias
			if name == "" {
				name = sel.Name
			}
			i, ok := index[name]
			if !ok {
				i = len(*groups)
				index[name] = i
				*groups = append(*groups, respGroup{})
			}
			(*groups)[i].fields = append((*groups)[i].fields, sel)
		case *ast.InlineFragment:
			if e := w.collect(sel.SelectionSet, groups, index); e != nil {
				return e
			}
		case *ast.FragmentSpread:
			f := w.frags[sel.Name]
			if f == nil || w.active[sel.Name] {
				continue
			}
			w.spread[sel.Name] = true
			w.active[sel.Name] = true
			e := w.collect(f.SelectionSet, groups, index)
			delete(w.active, sel.Name)
			if e != nil {
				return e
			}
		}
	}
	return nil
}

// add adds n to the complexity.
func (w *shapeWalker) add(n int) *gqlerror.Error {
	w.cost += n
	if l := w.l; l.cost >= 0 && w.cost > l.cost {
		return l.refuse(limitComplexity, "graphql-max-complexity", l.cost,
			"query complexity over "+strconv.Itoa(l.cost)+
				" (each field selected, fragments expanded, counts 1, and each pair of fields with the same response name in one selection set 1 more)")
	}
	return nil
}

// MutateOperationContext runs after validation, before execution: a
// mutation over HTTP may carry at most as many publishes as a POST
// /api/publish request may carry events, checked before any runs (all or
// nothing, as there). Over WebSocket each publish counts against the
// connection's message rate instead (see gqlBackend.Publish).
func (l *gqlLimits) MutateOperationContext(ctx context.Context, opCtx *graphql.OperationContext) *gqlerror.Error {
	if opCtx.Operation == nil || opCtx.Operation.Operation != ast.Mutation || ctx.Value(gqlRequestKey{}) == nil {
		return nil
	}
	n := 0
	for _, f := range graphql.CollectFields(opCtx, opCtx.Operation.SelectionSet, []string{"Mutation"}) {
		if f.Name == "publish" {
			n++
		}
	}
	if n > maxPublishBatch {
		l.s.metrics.GraphQLRefused.WithLabelValues(limitPublishes).Inc()
		l.s.metrics.PublishRequests.WithLabelValues("bad_request").Inc()
		return &gqlerror.Error{
			Message:    fmt.Sprintf("mutation with %d publishes: at most %d per request, as POST /api/publish", n, maxPublishBatch),
			Extensions: map[string]any{"code": "bad_request", "limit": limitPublishes, "max": maxPublishBatch},
		}
	}
	return nil
}
