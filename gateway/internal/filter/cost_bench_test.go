package filter

import (
	"fmt"
	"strings"
	"testing"
)

// hostileEvent is an event built to make filters work: a 1 MiB string,
// 2,000 items, and nested objects to compare.
func hostileEvent() *Parsed {
	var items []string
	for i := range 2000 {
		items = append(items, fmt.Sprintf(`{"sku":"s%d","q":%d,"tags":["a","b","c"]}`, i, i))
	}
	list := "[" + strings.Join(items, ",") + "]"
	big := strings.Repeat("abcdefghij", 1<<20/10)
	data := `{"doc":{"status":"open","total":12,"items":` + list + `,"copy":` + list + `,"name":"` + big + `"}}`
	return Parse("app.orders.1", []byte(data), false)
}

// filterCalibration is what a filter can do to an event: each
// expression's evaluation, up to the default cost limit, is timed against
// the units it is charged. A price that holds keeps ns/unit within the
// 15-100 of ordinary operations; before cost.go, matches ran at
// 1,900 ns a unit and size() at 90,000.
var filterCalibration = []string{
	"doc.status == 'open' && doc.total > 10",
	"doc.items.exists(i, i.sku == 'nope')",
	"doc.items.all(x, doc.items.all(y, x.q + y.q >= 0))",
	"doc.name.contains('zzz')",
	"doc.name.startsWith('zzz') || doc.name.endsWith('zzz')",
	"doc.name.matches('z')",
	"doc.name.matches('[a-z]{1,64}@[a-z]{1,64}')",
	"doc.name.matches('(a|b|c|d|e)*z')",
	"doc.items.exists(i, i.sku.matches('[a-z]{1,64}@[a-z]{1,64}'))",
	"size(doc.name) > 5",
	"doc.items.exists(i, size(doc.name) == 0)",
	"doc.items == doc.copy",
	"doc.items.exists(i, doc.items == doc.copy)",
	"doc.items.exists(i, i in doc.copy && false)",
	"doc.items.map(i, i.tags).size() == 0",
	"doc.name + doc.name == ''",
	"[doc.name, doc.name, doc.name] == [doc.name, doc.name, doc.name]",
	"doc.items.exists(i, string(i) == doc.name)",
	"doc.items.filter(i, i.q > 0).size() > 1999 && doc.items.filter(i, i.q > 1).size() > 0",
}

func BenchmarkFilterCostCalibration(b *testing.B) {
	p := hostileEvent()
	for _, text := range filterCalibration {
		ce, err := compileExpr(text, 10_000)
		if err != nil {
			b.Fatalf("%q: %v", text, err)
		}
		f := New(nil, ce, nil)
		b.Run(text, func(b *testing.B) {
			b.ReportAllocs()
			var cost uint64
			for b.Loop() {
				_, _, cost = f.Eval("app.orders.1", p)
			}
			b.ReportMetric(float64(cost), "units")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(max(cost, 1)), "ns/unit")
		})
	}
}
