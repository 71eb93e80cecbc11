package cdc_test

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/fanwire/fanwire/cdc"
)

// exampleProjections is the example of the issue and of docs/projections.md.
const exampleProjections = `
projections:
  - name: orders                 # subject: <prefix>.orders.<key>
    table: public.orders
    key: id
    columns: [id, status, total, customer_id, updated_at]   # optional; default all
    mode: sql                    # sql (default) | memory
    embed:
      - as: items                # doc field
        table: public.order_items
        on: {order_id: id}       # child column: parent column
        many: true
        order_by: id
      - as: customer
        table: public.customers
        on: {id: customer_id}
        many: false
        embed: []                # relations nest the same way
`

func TestProjectionConfigExampleParses(t *testing.T) {
	t.Parallel()
	got, err := cdc.ParseProjections([]byte(exampleProjections))
	if err != nil {
		t.Fatal(err)
	}
	want := []cdc.ProjectionSpec{{
		Name:    "orders",
		Table:   "public.orders",
		Key:     "id",
		Columns: []string{"id", "status", "total", "customer_id", "updated_at"},
		Mode:    cdc.ModeSQL,
		Embed: []cdc.EmbedSpec{
			{As: "items", Table: "public.order_items", On: map[string]string{"order_id": "id"}, Many: true, OrderBy: "id"},
			{As: "customer", Table: "public.customers", On: map[string]string{"id": "customer_id"}, Embed: []cdc.EmbedSpec{}},
		},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got  %#v\nwant %#v", got, want)
	}
}

func TestProjectionConfigDefaultsAndNesting(t *testing.T) {
	t.Parallel()
	got, err := cdc.ParseProjections([]byte(`
projections:
  - name: a
    table: a
    key: id
  - name: b
    table: s.b
    key: id
    mode: memory
    embed:
      - as: c
        table: c
        on: {b_id: id}
        embed:
          - as: d
            table: d
            on: {c_id: id, tenant: tenant}
            embed:
              - as: e
                table: e
                on: {d_id: id}
                many: true
                embed:
                  - as: f
                    table: f
                    on: {id: f_id}
`))
	if err != nil {
		t.Fatal(err)
	}
	if got[0].Mode != cdc.ModeSQL || got[1].Mode != cdc.ModeMemory {
		t.Errorf("modes %q, %q; want %q (the default) and %q", got[0].Mode, got[1].Mode, cdc.ModeSQL, cdc.ModeMemory)
	}
	if got[0].Columns != nil || got[0].Embed != nil {
		t.Errorf("a: columns %v, embed %v; want none", got[0].Columns, got[0].Embed)
	}
	if f := got[1].Embed[0].Embed[0].Embed[0].Embed[0]; f.As != "f" || f.Many || f.On["id"] != "f_id" {
		t.Errorf("the 4th level: %+v", f)
	}
}

// TestProjectionConfigUnknownFieldNamesItsLine: strict decoding, at the top,
// in a projection and in a nested embed.
func TestProjectionConfigUnknownFieldNamesItsLine(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ yaml, want string }{
		{"projection:\n  - name: a\n", `line 1, column 1: unknown field "projection"`},
		{"projections:\n  - name: a\n    table: a\n    key: id\n    colums: [id]\n", `line 5, column 5: unknown field "colums"`},
		{"projections:\n  - name: a\n    table: a\n    key: id\n    embed:\n      - as: b\n        table: b\n        on: {a_id: id}\n        embed:\n          - as: c\n            table: c\n            join: {b_id: id}\n",
			`line 12, column 13: unknown field "join"`},
	} {
		_, err := cdc.ParseProjections([]byte(tc.yaml))
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q: error %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

func TestProjectionConfigDocumentErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ yaml, want string }{
		{"", "empty"},
		{"# nothing\n", "empty"},
		{"projections:\n", `no "projections"`},
		{"other: 1\n", `unknown field "other"`},
		{"projections: []\n", `"projections" is empty`},
		{"projections: 5\n", "line 1, column 14:"},
		{"projections:\n  - name: a\n    columns: id\n", "line 3, column 14:"},
		{"projections:\n  - name: a\n    name: b\n", "line 3, column 5:"},
	} {
		_, err := cdc.ParseProjections([]byte(tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.yaml, err, tc.want)
		}
	}
}

// TestProjectionConfigRules: each structural rule, alone on a valid
// projection, gives the error naming its projection and field path.
func TestProjectionConfigRules(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, yaml string
		want       []string // each error line, in order
	}{
		{"name required", "- {table: t, key: id}",
			[]string{`projection [0]: name: required`}},
		{"name form", "- {name: Orders, table: t, key: id}",
			[]string{`projection "Orders": name: "Orders": use lower-case letters`}},
		{"name with a dot", "- {name: a.b, table: t, key: id}",
			[]string{`projection "a.b": name: "a.b": use lower-case letters`}},
		{"name length", "- {name: " + strings.Repeat("a", 64) + ", table: t, key: id}",
			[]string{`projection "` + strings.Repeat("a", 64) + `": name: "` + strings.Repeat("a", 64) + `": use lower-case letters`}},
		{"name unique", "- {name: a, table: t, key: id}\n- {name: b, table: t, key: id}\n- {name: a, table: u, key: id}",
			[]string{`projection "a": name: also the name of projection [0]; names must be unique`}},
		{"table required", "- {name: a, key: id}",
			[]string{`projection "a": table: required`}},
		{"table form", `- {name: a, table: '"Orders"', key: id}`,
			[]string{`projection "a": table: "\"Orders\"": use "table" or "schema.table"`}},
		{"table parts", "- {name: a, table: a.b.c, key: id}",
			[]string{`projection "a": table: "a.b.c": use "table" (in public) or "schema.table"`}},
		{"table empty schema", "- {name: a, table: .b, key: id}",
			[]string{`projection "a": table: ".b": use "table" or "schema.table"`}},
		{"table space", "- {name: a, table: order items, key: id}",
			[]string{`projection "a": table: "order items"`}},
		{"key required", "- {name: a, table: t}",
			[]string{`projection "a": key: required`}},
		{"key form", "- {name: a, table: t, key: 'id;'}",
			[]string{`projection "a": key: "id;": not a column name`}},
		{"mode", "- {name: a, table: t, key: id, mode: fast}",
			[]string{`projection "a": mode: "fast": use "sql" (the default) or "memory"`}},
		{"columns duplicate", "- {name: a, table: t, key: id, columns: [id, v, v]}",
			[]string{`projection "a": columns: "v" is listed twice`}},
		{"columns key", "- {name: a, table: t, key: id, columns: [v]}",
			[]string{`projection "a": columns: must include the key "id"`}},
		{"columns form", "- {name: a, table: t, key: id, columns: [id, 'v w']}",
			[]string{`projection "a": columns: "v w": not a column name`}},
		{"embed as required", "- {name: a, table: t, key: id, embed: [{table: c, on: {t_id: id}}]}",
			[]string{`projection "a": embed[0]: as: required`}},
		{"embed as unique", "- {name: a, table: t, key: id, embed: [{as: x, table: c, on: {t_id: id}}, {as: x, table: d, on: {t_id: id}}]}",
			[]string{`projection "a": embed[1] ("x"): as: also the field of embed[0]`}},
		{"embed as against columns", "- {name: a, table: t, key: id, columns: [id, items], embed: [{as: items, table: c, on: {t_id: id}}]}",
			[]string{`projection "a": embed[0] ("items"): as: the parent's column "items" has that field already`}},
		{"embed as without columns", "- {name: a, table: t, key: id, embed: [{as: id, table: c, on: {t_id: id}}]}",
			nil}, // the parent's columns are not known without a database
		{"embed table required", "- {name: a, table: t, key: id, embed: [{as: x, on: {t_id: id}}]}",
			[]string{`projection "a": embed[0] ("x"): table: required`}},
		{"embed table form", "- {name: a, table: t, key: id, embed: [{as: x, table: 'c-d', on: {t_id: id}}]}",
			[]string{`projection "a": embed[0] ("x"): table: "c-d"`}},
		{"embed on required", "- {name: a, table: t, key: id, embed: [{as: items, table: c}]}",
			[]string{`projection "a": embed[0] ("items"): on: needs at least one child column: parent column pair`}},
		{"embed on empty", "- {name: a, table: t, key: id, embed: [{as: items, table: c, on: {}}]}",
			[]string{`projection "a": embed[0] ("items"): on: needs at least one child column: parent column pair`}},
		{"embed on names", "- {name: a, table: t, key: id, embed: [{as: x, table: c, on: {'t id': id, b: '', c: 'x\"'}}]}",
			[]string{
				`projection "a": embed[0] ("x"): on: b: parent column empty name`,
				`projection "a": embed[0] ("x"): on: c: parent column "x\"": not a column name`,
				`projection "a": embed[0] ("x"): on: child column "t id": not a column name`,
			}},
		{"embed order_by without many", "- {name: a, table: t, key: id, embed: [{as: x, table: c, on: {id: c_id}, order_by: id}]}",
			[]string{`projection "a": embed[0] ("x"): order_by: only with many: true`}},
		{"embed order_by form", "- {name: a, table: t, key: id, embed: [{as: x, table: c, on: {t_id: id}, many: true, order_by: 'id desc'}]}",
			[]string{`projection "a": embed[0] ("x"): order_by: "id desc": not a column name`}},
		{"embed columns duplicate", "- {name: a, table: t, key: id, embed: [{as: x, table: c, on: {t_id: id}, columns: [t_id, t_id]}]}",
			[]string{`projection "a": embed[0] ("x"): columns: "t_id" is listed twice`}},
		{"nested embed", "- {name: a, table: t, key: id, embed: [{as: x, table: c, on: {t_id: id}, columns: [id, y], embed: [{as: y, table: d, on: {c_id: id}}, {table: e, on: {c_id: id}, order_by: n}]}]}",
			[]string{
				`projection "a": embed[0] ("x"): embed[0] ("y"): as: the parent's column "y" has that field already`,
				`projection "a": embed[0] ("x"): embed[1]: as: required`,
				`projection "a": embed[0] ("x"): embed[1]: order_by: only with many: true`,
			}},
		{"depth 5", "- {name: a, table: t, key: id, embed: [{as: b, table: b, on: {a_id: id}, embed: [{as: c, table: c, on: {b_id: id}, embed: [{as: d, table: d, on: {c_id: id}, embed: [{as: e, table: e, on: {d_id: id}, embed: [{as: f, table: f, on: {e_id: id}}]}]}]}]}]}",
			[]string{`projection "a": embed[0] ("b"): embed[0] ("c"): embed[0] ("d"): embed[0] ("e"): embed: nested 5 levels deep; at most 4`}},
		{"depth 5, empty", "- {name: a, table: t, key: id, embed: [{as: b, table: b, on: {a_id: id}, embed: [{as: c, table: c, on: {b_id: id}, embed: [{as: d, table: d, on: {c_id: id}, embed: [{as: e, table: e, on: {d_id: id}, embed: []}]}]}]}]}",
			nil},
		{"valid names", "- {name: _a1, table: Sales.Order$2, key: Id, columns: [Id, x$], embed: [{as: 'line items', table: _t, on: {A: Id}}]}",
			nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := cdc.ParseProjections([]byte("projections:\n" + tc.yaml + "\n"))
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("error %v, want none", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tc.want) {
				t.Fatalf("errors:\n%v\nwant %d", err, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.HasPrefix(lines[i], w) {
					t.Errorf("error %d: %q, want it to start with %q", i, lines[i], w)
				}
			}
		})
	}
}

// TestProjectionConfigReportsEveryError: the problems of several
// projections and embeds come at once, in order.
func TestProjectionConfigReportsEveryError(t *testing.T) {
	t.Parallel()
	_, err := cdc.ParseProjections([]byte(`
projections:
  - name: orders
    table: public.orders
    key: id
    mode: Memory
    embed:
      - as: items
        table: public.order_items
  - table: x.y.z
    key: id
`))
	want := `projection "orders": mode: "Memory": use "sql" (the default) or "memory"
projection "orders": embed[0] ("items"): on: needs at least one child column: parent column pair
projection [1]: name: required
projection [1]: table: "x.y.z": use "table" (in public) or "schema.table"`
	if err == nil || err.Error() != want {
		t.Errorf("error:\n%v\nwant:\n%s", err, want)
	}
}

func TestLoadProjectionsNamesTheFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	if err := os.WriteFile(good, []byte(exampleProjections), 0o644); err != nil {
		t.Fatal(err)
	}
	specs, err := cdc.LoadProjections(good)
	if err != nil || len(specs) != 1 || specs[0].Name != "orders" {
		t.Errorf("LoadProjections(good): %v, %v", specs, err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("projections:\n  - name: orders\n    tabel: orders\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cdc.LoadProjections(bad); err == nil || err.Error() != bad+`: line 3, column 5: unknown field "tabel"` {
		t.Errorf("LoadProjections(bad): %v", err)
	}
	if _, err := cdc.LoadProjections(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("LoadProjections(missing): %v", err)
	}
}
