package filter

import (
	"errors"
	"fmt"
	"regexp"
	"regexp/syntax"

	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/overloads"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
	"cel.dev/cel-go/common/types/traits"
	"cel.dev/cel-go/interpreter"
)

// Pricing filters by what they do. CEL's cost model prices most operations
// by the sizes of their operands, which follows their time here at 15-100
// ns a unit. Three operations one expression could turn into milliseconds
// per event at a price of a few units are priced by their real work
// (BenchmarkFilterCostCalibration measures each; docs/benchmarks.md,
// "Filter cost"):
//   - matches: CEL prices it by the pattern's text, RE2 works through the
//     input times its program's instructions. `[a-z]{1,64}@[a-z]{1,64}`
//     (257 instructions) over 1 MB took 1.1 s at 575,000 units. Patterns
//     must be constants (compiled once, with the program), their programs
//     together at most maxFilterRegexInsts instructions, and a call is
//     priced (len+1) × instructions / regexStepsPerUnit, checked before
//     it runs.
//   - size() of a string counts its runes: O(n), priced 1 by CEL.
//   - == and != between lists or maps, and `in`, compare every element,
//     nested, priced by the top-level size; + of two dyn strings is not
//     priced at all. Expressions with such a comparison of two
//     non-constants are always cost-tracked (inspectExpr).

const (
	// maxFilterRegexInsts bounds the RE2 programs of one expression's
	// patterns together: 1,000 instructions are about 40 KiB compiled,
	// far more than patterns users write (an e-mail pattern is about 30;
	// \w{1,64} is 129); `(?:.{1900}){1000}`, 1.9 million, is refused.
	maxFilterRegexInsts = 1000
	// regexStepsPerUnit is how many (input byte × instruction) steps of
	// RE2 cost one unit: about 4 ns a step here, and a unit is priced
	// near 60 ns elsewhere.
	regexStepsPerUnit = 16
	// stringBytesPerUnit: size() of a string reads this many bytes per
	// unit (utf8.RuneCountInString: about 0.4 ns a byte).
	stringBytesPerUnit = 128
	// concatBytesPerUnit: a string concatenation copies about 1.4 ns a
	// byte.
	concatBytesPerUnit = 32
	// deepUnits is the price of each value a deep equality compares
	// (about 125-370 ns through CEL's adapters).
	deepUnits = 4
)

// regexInsts is the size of pattern's RE2 program, as Go's regexp
// compiles it, or an error when it is over limit: a pattern whose bound
// (regexBound, on the parsed tree) is far over is refused without being
// compiled, since compiling (?:.{1900}){1000} to count its instructions
// would allocate the 1.9 million of them (80 MB) the limit is there to
// refuse.
func regexInsts(pattern string, limit int) (int, error) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return 0, err
	}
	if b := regexBound(re, 4*limit); b > 4*limit {
		return b, errRegexTooLarge
	}
	prog, err := syntax.Compile(re.Simplify())
	if err != nil {
		return 0, err
	}
	if len(prog.Inst) > limit {
		return len(prog.Inst), errRegexTooLarge
	}
	return len(prog.Inst), nil
}

var errRegexTooLarge = errors.New("regex program too large")

// regexBound bounds the instructions re compiles to, stopping past cap:
// each repetition counts its body as often as it may repeat, as the
// compiler unrolls it.
func regexBound(re *syntax.Regexp, cap int) int {
	n := 0
	switch re.Op {
	case syntax.OpLiteral:
		n = len(re.Rune)
	case syntax.OpCapture, syntax.OpStar, syntax.OpPlus, syntax.OpQuest:
		n = 2 + regexBound(re.Sub[0], cap)
	case syntax.OpRepeat:
		times := re.Max
		if times < 0 {
			times = re.Min + 1
		}
		body := regexBound(re.Sub[0], cap) + 1
		if times > 0 && body > cap/times {
			return cap + 1
		}
		n = times * body
	case syntax.OpConcat, syntax.OpAlternate:
		for _, sub := range re.Sub {
			if n += regexBound(sub, cap) + 1; n > cap {
				return cap + 1
			}
		}
	default:
		n = 1
	}
	return min(n, cap+1)
}

// inspectExpr finds e's matches calls: each pattern must be a constant
// (a pattern taken from the event or the claims would be compiled on
// every evaluation, at a cost nothing bounds), and their programs
// together at most maxFilterRegexInsts. It returns each pattern's
// instructions, and whether e compares two values neither of which is a
// constant (==, !=, in, +): CEL's static estimate of those may be small
// (doc in [doc]) while their work grows with the event, so their cost is
// always tracked.
func inspectExpr(e ast.Expr) (insts map[string]int, track bool, err error) {
	total := 0
	visitor := ast.NewExprVisitor(func(x ast.Expr) {
		if err != nil || x.Kind() != ast.CallKind {
			return
		}
		call := x.AsCall()
		switch call.FunctionName() {
		case operators.Equals, operators.NotEquals, operators.In, operators.Add:
			if args := call.Args(); len(args) == 2 && !isConstant(args[0]) && !isConstant(args[1]) {
				track = true
			}
			return
		case overloads.Matches:
		default:
			return
		}
		args := call.Args()
		pat := args[len(args)-1] // matches(s, re) or s.matches(re)
		lit, ok := pat.AsLiteral().(types.String)
		if pat.Kind() != ast.LiteralKind || !ok {
			err = fmt.Errorf("%w: matches takes a constant pattern (a string literal), not one computed from the event or the claims", ErrBadFilter)
			return
		}
		n, cerr := regexInsts(string(lit), maxFilterRegexInsts-total)
		if cerr != nil && !errors.Is(cerr, errRegexTooLarge) {
			err = fmt.Errorf("%w: matches: %v", ErrBadFilter, cerr)
			return
		}
		total += n
		if total > maxFilterRegexInsts {
			err = fmt.Errorf("%w: the expression's patterns compile to %d or more RE2 instructions, over %d: simplify them (a bounded repetition such as {1,64} repeats its body that many times)", ErrBadFilter, total, maxFilterRegexInsts)
			return
		}
		if insts == nil {
			insts = make(map[string]int)
		}
		insts[string(lit)] = n
	})
	ast.PostOrderVisit(e, visitor)
	return insts, track, err
}

// isConstant reports whether e is a literal, or a list or map of them.
func isConstant(e ast.Expr) bool {
	switch e.Kind() {
	case ast.LiteralKind:
		return true
	case ast.ListKind:
		for _, el := range e.AsList().Elements() {
			if !isConstant(el) {
				return false
			}
		}
		return true
	case ast.MapKind:
		for _, en := range e.AsMap().Entries() {
			me := en.AsMapEntry()
			if !isConstant(me.Key()) || !isConstant(me.Value()) {
				return false
			}
		}
		return true
	}
	return false
}

// regexCall is the matches implementation: the pattern compiled once, and
// a call over the cost limit refused before it runs.
func regexCall(maxCost uint64) []*interpreter.RegexOptimization {
	factory := func(call interpreter.InterpretableCall, pattern string) (interpreter.InterpretableCall, error) {
		re, err := regexp.Compile(pattern)
		if err != nil {
			return nil, err
		}
		insts, err := regexInsts(pattern, maxFilterRegexInsts)
		if err != nil {
			return nil, err
		}
		return interpreter.NewCall(call.ID(), call.Function(), call.OverloadID(), call.Args(), func(values ...ref.Val) ref.Val {
			if len(values) != 2 {
				return types.NoSuchOverloadErr()
			}
			in, ok := values[0].Value().(string)
			if !ok {
				return types.NoSuchOverloadErr()
			}
			if c := regexCost(len(in), insts); c > maxCost {
				return types.NewErr("matches: a %d-byte string against a %d-instruction pattern costs %d units, over the filter's limit of %d", len(in), insts, c, maxCost)
			}
			return types.Bool(re.MatchString(in))
		}), nil
	}
	return []*interpreter.RegexOptimization{
		{Function: overloads.Matches, OverloadID: overloads.Matches, RegexIndex: 1, Factory: factory},
		{Function: overloads.Matches, OverloadID: overloads.MatchesString, RegexIndex: 1, Factory: factory},
	}
}

func regexCost(n, insts int) uint64 {
	return (uint64(n) + 1) * uint64(insts) / regexStepsPerUnit
}

// callPricer is a program's runtime prices of the calls CEL misprices.
type callPricer struct {
	insts   map[string]int // the program's patterns' instructions
	maxCost uint64         // the program's limit: no price needs to be known past it
}

func (cp callPricer) CallCost(function, _ string, args []ref.Val, result ref.Val) *uint64 {
	// On dyn operands (doc's fields) the overload is chosen at run time
	// and overloadID may be empty: the function's name decides.
	var c uint64
	switch {
	case function == overloads.Matches:
		if len(args) != 2 {
			return nil
		}
		s, ok1 := args[0].Value().(string)
		p, ok2 := args[1].Value().(string)
		if !ok1 || !ok2 {
			return nil
		}
		c = regexCost(len(s), cp.insts[p])
		if types.IsError(result) {
			c = 1 // refused before it ran (regexCall)
		}
	case function == overloads.Size:
		if len(args) != 1 {
			return nil
		}
		s, ok := args[0].Value().(string)
		if !ok {
			return nil
		}
		c = 1 + uint64(len(s))/stringBytesPerUnit
	case function == operators.Equals, function == operators.NotEquals:
		if len(args) != 2 {
			return nil
		}
		a := deepSize(args[0].Value(), cp.maxCost+1)
		if a <= 1 {
			return nil // a scalar: CEL's price holds
		}
		b := deepSize(args[1].Value(), a)
		if b <= 1 {
			return nil
		}
		c = 1 + deepUnits*b // the smaller: the comparison ends with it
	case function == operators.Add:
		// dyn + dyn: CEL prices add_string only when the checker chose it.
		if len(args) != 2 {
			return nil
		}
		a, ok1 := args[0].Value().(string)
		b, ok2 := args[1].Value().(string)
		if !ok1 || !ok2 {
			return nil
		}
		c = 1 + uint64(len(a)+len(b))/concatBytesPerUnit
	case function == operators.In:
		// x in list compares x with each element, deeply.
		if len(args) != 2 {
			return nil
		}
		n := listLen(args[1])
		if n == 0 {
			return nil
		}
		e := deepSize(args[0].Value(), cp.maxCost+1)
		if e <= 1 {
			return nil // a scalar: CEL's price (the list's length) holds
		}
		c = 1 + n*deepUnits*e
	default:
		return nil
	}
	return &c
}

// listLen is the length of a list value (0 for anything else).
func listLen(v ref.Val) uint64 {
	if l, ok := v.(traits.Lister); ok {
		if n, ok := l.Size().(types.Int); ok && n > 0 {
			return uint64(n)
		}
	}
	return 0
}

// deepSize counts the values inside a JSON value (maps, lists and their
// elements, nested), up to limit; scalars count 1. Containers CEL built
// (list and map literals) count their top level.
func deepSize(v any, limit uint64) uint64 {
	switch x := v.(type) {
	case map[string]any:
		n := uint64(1)
		for _, e := range x {
			if n += deepSize(e, limit-n); n >= limit {
				return limit
			}
		}
		return n
	case []any:
		n := uint64(1)
		for _, e := range x {
			if n += deepSize(e, limit-n); n >= limit {
				return limit
			}
		}
		return n
	case []ref.Val:
		n := uint64(1)
		for _, e := range x {
			if n += deepSize(e.Value(), limit-n); n >= limit {
				return limit
			}
		}
		return n
	case map[ref.Val]ref.Val:
		n := uint64(1)
		for _, e := range x {
			if n += deepSize(e.Value(), limit-n); n >= limit {
				return limit
			}
		}
		return n
	}
	return 1
}
