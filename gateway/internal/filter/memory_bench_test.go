package filter

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkCompiledExprMemory measures the heap one compiled expression
// holds (B/expr: its AST, checked types, interpretable plan and regex
// programs), which the estimate behind Expr.Size follows (exprBaseBytes,
// exprTextBytes, exprInstBytes). Each op compiles 100 distinct texts of
// the shape and keeps them alive while the heap is measured.
func BenchmarkCompiledExprMemory(b *testing.B) {
	long := "doc.status == 'open'" + strings.Repeat(" && doc.total > 1", 110) // about 2,000 bytes
	for _, tc := range []struct{ name, text string }{
		{"short", "doc.status == 'open' && doc.total > 100"},
		{"2000B", long},
		{"regex", "doc.name.matches('^[a-z]{1,40}@[a-z]{1,40}\\\\.(com|org|net)$')"},
		{"regex900", "doc.name.matches('^(?:[a-f0-9]{1,60}-){2}$') && doc.x.matches('^(?:ab|cd|ef){1,60}$')"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			const n = 100
			var per, estimate float64
			for b.Loop() {
				keep := make([]*Expr, 0, n)
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				for i := range n {
					ce, err := compileExpr(tc.text+" || doc.k == "+strconv.Itoa(i), 1<<20)
					if err != nil {
						b.Fatal(err)
					}
					keep = append(keep, ce)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				per = float64(after.HeapAlloc-before.HeapAlloc) / n
				estimate = float64(keep[0].Size())
				runtime.KeepAlive(keep)
			}
			b.ReportMetric(per, "B/expr")
			b.ReportMetric(estimate, "estimate-B/expr")
		})
	}
}
