package filter

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"cel.dev/cel-go/cel"
	"cel.dev/cel-go/common/cost"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/interpreter"
)

// A filter expression: one CEL text, type-checked, bounded in cost and
// in the regex programs it holds, compiled once per node, and evaluated
// against an event's subject and data and a connection's claims.

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

// Expr is one expression text, compiled.
type Expr struct {
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

// Text is the expression's text.
func (ce *Expr) Text() string { return ce.text }

// Size is the memory the compiled expression holds, estimated (bytes).
func (ce *Expr) Size() int { return ce.size }

func compileExpr(text string, maxCost uint64) (*Expr, error) {
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
	ce := &Expr{text: text}
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
// types, interpretable plan and regex programs), from
// BenchmarkCompiledExprMemory: about 2 KiB for a short expression, 57 KiB
// for one of 2,000 bytes, and 150 bytes per RE2 instruction of its
// patterns (the regex program and what CEL and the matcher keep of it).
// The estimate is above each measured shape.
const (
	exprBaseBytes = 8 << 10
	exprTextBytes = 48
	exprInstBytes = 160
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

// evalVars is the activation of one evaluation.
type evalVars struct {
	subject string
	p       *Parsed
	claims  map[string]any
}

func (v *evalVars) ResolveName(name string) (any, bool) {
	switch name {
	case varDoc:
		return v.p.Doc, true
	case varData:
		return v.p.Data, true
	case varSubject:
		return v.subject, true
	case varOp:
		return v.p.Op, true
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
func (ce *Expr) accepts(vars *evalVars) (ok, errored bool, cost uint64) {
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
