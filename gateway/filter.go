package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/interpreter"

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

// The variables a filter sees.
const (
	varDoc     = "doc"     // the data's "doc" member when it has one (ingest events), else the data
	varData    = "data"    // the whole data
	varSubject = "subject" // the event's subject
	varOp      = "op"      // the data's "op" (ingest: insert, update, delete, truncate), else ""
	varClaims  = "claims"  // the connection's token claims (an empty map without a token)
)

// Limits of a filter's text.
const (
	maxWhereLen   = 2048
	maxWhereDepth = 32
)

var filterEnv = sync.OnceValues(func() (*cel.Env, error) {
	return cel.NewEnv(
		cel.Variable(varDoc, cel.DynType),
		cel.Variable(varData, cel.DynType),
		cel.Variable(varSubject, cel.StringType),
		cel.Variable(varOp, cel.StringType),
		cel.Variable(varClaims, cel.MapType(cel.StringType, cel.DynType)),
		cel.CrossTypeNumericComparisons(true),
		cel.ParserExpressionSizeLimit(maxWhereLen),
		cel.ParserRecursionLimit(maxWhereDepth),
	)
})

// ErrBadFilter is wrapped by the errors of expressions that do not
// compile; the message names the position ("1:9").
var ErrBadFilter = errors.New("bad filter")

// compiledExpr is one expression text, compiled.
type compiledExpr struct {
	text   string
	prog   cel.Program
	eqs    []eqTerm // its top-level equalities of a doc field to a constant (indexable)
	claims bool     // it names claims: its results depend on the connection
	// tracked: its cost is tracked at run time (and limited); else every
	// evaluation is charged cost, its static bound.
	tracked bool
	cost    uint64
	limit   uint64 // the cost limit of a tracked expression
	size    int    // the memory it holds, estimated (bytes)
	// claimNames are the claims it reads (claims.x, claims["x"]);
	// allClaims: it reads them otherwise (the whole map, a computed key).
	claimNames []string
	allClaims  bool
}

// eqTerm is `doc.<path> == <constant>` (or the mirror), a conjunct of an
// expression: every event it accepts has that value at that path.
type eqTerm struct {
	path  []string
	key   string   // the constant's canonical key (valueKey); "" when claim says where it comes from
	claim []string // the claims path of a constant taken from the claims
}

func compileExpr(text string, maxCost uint64) (*compiledExpr, error) {
	if strings.TrimSpace(text) == "" {
		return nil, fmt.Errorf("%w: the expression is empty", ErrBadFilter)
	}
	if len(text) > maxWhereLen {
		return nil, fmt.Errorf("%w: the expression is %d bytes, over %d", ErrBadFilter, len(text), maxWhereLen)
	}
	env, err := filterEnv()
	if err != nil {
		return nil, err
	}
	checked, iss := env.Compile(text)
	if iss != nil && iss.Err() != nil {
		return nil, fmt.Errorf("%w: %s", ErrBadFilter, issueText(iss))
	}
	if t := checked.OutputType(); !t.IsExactType(types.BoolType) && !t.IsExactType(types.DynType) {
		return nil, fmt.Errorf("%w: the expression is a %s, not a bool", ErrBadFilter, t)
	}
	nat := checked.NativeRep()
	insts, track, err := inspectExpr(nat.Expr())
	if err != nil {
		return nil, err
	}
	ce := &compiledExpr{text: text}
	// Runtime cost tracking is only needed where the static estimate
	// cannot bound the cost: tracking halves the speed of a plain
	// comparison (docs/benchmarks.md, "Live views"). A cheap expression is
	// charged its estimate. The estimate assumes no string or list in an
	// event is larger than maxEventBytes, which no delivered event can be.
	opts := []cel.ProgramOption{cel.EvalOptions(cel.OptOptimize)}
	if len(insts) > 0 {
		opts = append(opts, cel.OptimizeRegex(regexCall(maxCost)...))
	}
	est, err := env.EstimateCost(checked, sizeBound{})
	if err != nil || track || est.Max > cheapFilterCost {
		ce.tracked, ce.limit = true, maxCost
		opts = append(opts, cel.CostLimit(maxCost), cel.CostTracking(callPricer{insts: insts, maxCost: maxCost}))
	} else {
		ce.cost = max(est.Max, 1)
	}
	prog, err := env.Program(checked, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadFilter, err)
	}
	ce.prog = prog
	ce.claims = namesVar(nat.Expr(), varClaims)
	if ce.claims {
		ce.claimNames, ce.allClaims = claimUses(nat.Expr())
	}
	ce.eqs = conjunctEqualities(nat.Expr(), nil)
	n := 0
	for _, i := range insts {
		n += i
	}
	ce.size = exprBaseBytes + exprTextBytes*len(text) + exprInstBytes*n
	return ce, nil
}

// cheapFilterCost: an expression whose static estimate is at most this
// is charged its estimate, without tracking its cost.
const cheapFilterCost = 64

// The memory a compiled expression holds, estimated (its AST, checked
// types, interpretable plan and regex programs), as measured by
// BenchmarkCompiledExprMemory: 4-9 KiB for a short expression, 60-90 KiB
// for one of 2,000 bytes, about 40 bytes per RE2 instruction.
const (
	exprBaseBytes = 8 << 10
	exprTextBytes = 48
	exprInstBytes = 48
)

// maxEventBytes bounds the size of any value in an event's data (a
// string's bytes, a list's or map's elements), for cost estimates: events
// larger than a connection's mailbox are never delivered, and mailboxes
// are at most this large in practice (--mailbox-bytes defaults to 4 MiB).
const maxEventBytes = 64 << 20

// sizeBound is the cost estimator's view of an event: nothing in it is
// larger than maxEventBytes.
type sizeBound struct{}

// EstimateCallCost bounds the calls callPricer prices otherwise than CEL.
func (sizeBound) EstimateCallCost(_, overloadID string, _ *cost.AstNode, _ []cost.AstNode) *cost.CallEstimate {
	switch overloadID {
	case overloads.SizeString, overloads.SizeStringInst:
		return &cost.CallEstimate{CostEstimate: cost.CostEstimate{Min: 1, Max: 1 + maxEventBytes/stringBytesPerUnit}}
	case overloads.Matches, overloads.MatchesString:
		return &cost.CallEstimate{CostEstimate: cost.CostEstimate{Min: 1, Max: regexCost(maxEventBytes, maxFilterRegexInsts)}}
	}
	return nil
}

func (sizeBound) EstimateSize(cost.AstNode) *cost.SizeEstimate {
	return &cost.SizeEstimate{Min: 0, Max: maxEventBytes}
}

// issueText is a compile error as "1:9: message" per issue, without the
// source excerpt CEL draws (it is the client's own text).
func issueText(iss *cel.Issues) string {
	var parts []string
	for _, e := range iss.Errors() {
		loc := e.Location
		parts = append(parts, strconv.Itoa(loc.Line())+":"+strconv.Itoa(loc.Column()+1)+": "+e.Message)
	}
	if len(parts) == 0 {
		return iss.Err().Error()
	}
	return strings.Join(parts, "; ")
}

// namesVar reports whether e refers to the variable name.
func namesVar(e ast.Expr, name string) bool {
	found := false
	visitor := ast.NewExprVisitor(func(x ast.Expr) {
		if x.Kind() == ast.IdentKind && x.AsIdent() == name {
			found = true
		}
	})
	ast.PostOrderVisit(e, visitor)
	return found
}

// claimUses lists the claims e reads by name, or says it reads them all.
func claimUses(e ast.Expr) (names []string, all bool) {
	var visit func(x ast.Expr)
	visit = func(x ast.Expr) {
		switch x.Kind() {
		case ast.IdentKind:
			if x.AsIdent() == varClaims {
				all = true
			}
			return
		case ast.SelectKind:
			s := x.AsSelect()
			if op := s.Operand(); op.Kind() == ast.IdentKind && op.AsIdent() == varClaims {
				names = append(names, s.FieldName())
				return
			}
			visit(s.Operand())
			return
		case ast.CallKind:
			c := x.AsCall()
			args := c.Args()
			if c.FunctionName() == operators.Index && len(args) == 2 && args[0].Kind() == ast.IdentKind && args[0].AsIdent() == varClaims && args[1].Kind() == ast.LiteralKind {
				if k, ok := args[1].AsLiteral().(types.String); ok {
					names = append(names, string(k))
					return
				}
			}
			if c.IsMemberFunction() {
				visit(c.Target())
			}
			for _, a := range args {
				visit(a)
			}
			return
		case ast.ListKind:
			for _, el := range x.AsList().Elements() {
				visit(el)
			}
		case ast.MapKind:
			for _, en := range x.AsMap().Entries() {
				me := en.AsMapEntry()
				visit(me.Key())
				visit(me.Value())
			}
		case ast.ComprehensionKind:
			cx := x.AsComprehension()
			visit(cx.IterRange())
			visit(cx.AccuInit())
			visit(cx.LoopCondition())
			visit(cx.LoopStep())
			visit(cx.Result())
		}
	}
	visit(e)
	sort.Strings(names)
	return compactStrings(names), all
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

// conjunctEqualities appends e's top-level equalities of a doc field to a
// constant (through && only: an || or a ! hides them).
func conjunctEqualities(e ast.Expr, out []eqTerm) []eqTerm {
	if e.Kind() != ast.CallKind {
		return out
	}
	call := e.AsCall()
	switch call.FunctionName() {
	case operators.LogicalAnd:
		for _, a := range call.Args() {
			out = conjunctEqualities(a, out)
		}
	case operators.Equals:
		args := call.Args()
		if len(args) != 2 {
			return out
		}
		for _, side := range [2][2]ast.Expr{{args[0], args[1]}, {args[1], args[0]}} {
			root, path := fieldPath(side[0])
			if root != varDoc || len(path) == 0 {
				continue
			}
			if side[1].Kind() == ast.LiteralKind {
				if k, ok := valueKey(literalNative(side[1].AsLiteral())); ok {
					return append(out, eqTerm{path: path, key: k})
				}
			}
			if croot, cpath := fieldPath(side[1]); croot == varClaims && len(cpath) > 0 {
				return append(out, eqTerm{path: path, claim: cpath})
			}
		}
	}
	return out
}

// fieldPath splits x.a.b (or x["a"].b) into "x" and [a b]; "" when e is
// not such a chain.
func fieldPath(e ast.Expr) (root string, path []string) {
	for {
		switch e.Kind() {
		case ast.IdentKind:
			for i, j := 0, len(path)-1; i < j; i, j = i+1, j-1 {
				path[i], path[j] = path[j], path[i]
			}
			return e.AsIdent(), path
		case ast.SelectKind:
			s := e.AsSelect()
			if s.IsTestOnly() {
				return "", nil
			}
			path = append(path, s.FieldName())
			e = s.Operand()
		case ast.CallKind:
			c := e.AsCall()
			if c.FunctionName() != operators.Index || len(c.Args()) != 2 || c.Args()[1].Kind() != ast.LiteralKind {
				return "", nil
			}
			s, ok := c.Args()[1].AsLiteral().(types.String)
			if !ok {
				return "", nil
			}
			path = append(path, string(s))
			e = c.Args()[0]
		default:
			return "", nil
		}
	}
}

func literalNative(v ref.Val) any {
	switch x := v.(type) {
	case types.String:
		return string(x)
	case types.Int:
		return int64(x)
	case types.Uint:
		if uint64(x) <= math.MaxInt64 {
			return int64(x)
		}
		return float64(x)
	case types.Double:
		return float64(x)
	case types.Bool:
		return bool(x)
	case types.Null:
		return nil
	}
	return struct{}{} // not indexable
}

// evalVars is the activation of one evaluation.
type evalVars struct {
	subject string
	p       *parsedData
	claims  map[string]any
}

func (v *evalVars) ResolveName(name string) (any, bool) {
	switch name {
	case varDoc:
		return v.p.doc, true
	case varData:
		return v.p.data, true
	case varSubject:
		return v.subject, true
	case varOp:
		return v.p.op, true
	case varClaims:
		return v.claims, true
	}
	return nil, false
}

func (v *evalVars) Parent() interpreter.Activation { return nil }

// accepts evaluates ce; an evaluation error (a missing field, a wrong
// type, the cost limit) is a rejection, reported by errored. cost is what
// the evaluation spent (its static bound, for an untracked expression; the
// limit, for one stopped by it).
func (ce *compiledExpr) accepts(vars *evalVars) (ok, errored bool, cost uint64) {
	out, det, err := ce.prog.Eval(vars)
	cost = ce.cost
	if ce.tracked {
		cost = ce.limit // stopped by it, if CEL reports nothing
		if det != nil {
			if c := det.ActualCost(); c != nil {
				cost = *c
			}
		}
	}
	return err == nil && out == types.True, err != nil, cost
}

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
