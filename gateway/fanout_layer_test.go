package gateway

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFanoutCoreStandsAlone: the fan-out core (fanout_*.go) names nothing
// declared in the package's other files but errors.go's (its public
// codes): the layers doc.go describes, checked from the source. Each
// core file's identifiers that it does not resolve itself are package
// names of other files, imports or Go's own; only the first may be, and
// only when they are in the core or in errors.go.
func TestFanoutCoreStandsAlone(t *testing.T) {
	all, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	declared := map[string]string{} // package-level name → its file
	var core []*ast.File
	for _, name := range all {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		// With object resolution: a file's Unresolved identifiers are
		// what it takes from elsewhere.
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					declared[d.Name.Name] = name
				}
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					switch sp := sp.(type) {
					case *ast.TypeSpec:
						declared[sp.Name.Name] = name
					case *ast.ValueSpec:
						for _, n := range sp.Names {
							declared[n.Name] = name
						}
					}
				}
			}
		}
		if strings.HasPrefix(name, "fanout_") {
			core = append(core, f)
		}
	}
	if len(core) < 5 {
		t.Fatalf("%d fanout_*.go files: the core is missing", len(core))
	}
	for _, f := range core {
		imports := map[string]bool{}
		for _, im := range f.Imports {
			p := strings.Trim(im.Path.Value, `"`)
			n := p[strings.LastIndex(p, "/")+1:]
			if im.Name != nil {
				n = im.Name.Name
			}
			imports[n] = true
		}
		var above []string
		for _, id := range f.Unresolved {
			file, ok := declared[id.Name]
			switch {
			case imports[id.Name], types.Universe.Lookup(id.Name) != nil && !ok:
			case !ok:
				t.Errorf("%s: %s is declared nowhere in the package", fset.Position(id.Pos()), id.Name)
			case strings.HasPrefix(file, "fanout_"), file == "errors.go":
			default:
				above = append(above, id.Name+" ("+file+")")
			}
		}
		slices.Sort(above)
		if above = slices.Compact(above); len(above) > 0 {
			t.Errorf("%s uses what the layers above the core declare: %s", fset.File(f.Pos()).Name(), strings.Join(above, ", "))
		}
	}
}
