package filter

import (
	"math"
	"slices"

	"cel.dev/cel-go/common/ast"
	"cel.dev/cel-go/common/operators"
	"cel.dev/cel-go/common/types"
	"cel.dev/cel-go/common/types/ref"
)

// What a compiled expression's tree says about it: the claims it reads
// (which decide when equal filters may be shared) and its top-level
// equalities of a doc field to a constant (which the view index files it
// under).

// eqTerm is `doc.<path> == <constant>` (or the mirror), a conjunct of an
// expression: every event it accepts has that value at that path.
type eqTerm struct {
	path  []string
	key   string   // the constant's canonical key (ValueKey); "" when claim says where it comes from
	claim []string // the claims path of a constant taken from the claims
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
	slices.Sort(names)
	return slices.Compact(names), all
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
				if k, ok := ValueKey(literalNative(side[1].AsLiteral())); ok {
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
