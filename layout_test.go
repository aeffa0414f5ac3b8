package streamwal_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// module is this module's import path.
const module = "github.com/streamwal/streamwal"

// TestServicesDoNotImportEachOther holds the layout of DESIGN.md: the
// coordinator and the node are separate services that talk over NATS, so
// no package of one imports a package of the other. (Black-box tests that
// run a whole system may.)
func TestServicesDoNotImportEachOther(t *testing.T) {
	for _, c := range []struct{ dir, forbidden string }{
		{"services/coord", module + "/services/node"},
		{"services/node", module + "/services/coord"},
	} {
		for file, imp := range imports(t, c.dir) {
			for _, p := range imp {
				if p == c.forbidden || strings.HasPrefix(p, c.forbidden+"/") {
					t.Errorf("%s imports %s", file, p)
				}
			}
		}
	}
}

// imports returns the import paths of every Go file under dir but the
// tests, by file.
func imports(t *testing.T, dir string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		f, err := parser.ParseFile(fset, path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, s := range f.Imports {
			p, err := strconv.Unquote(s.Path.Value)
			if err != nil {
				return err
			}
			out[path] = append(out[path], p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPipelineIsPure holds the writer's core (jetstream/pipeline) to what
// its doc promises: no NATS and no clock. It imports nothing of NATS, and
// reads the time only from its callers.
func TestPipelineIsPure(t *testing.T) {
	for file, imp := range imports(t, "jetstream/pipeline") {
		for _, p := range imp {
			if strings.HasPrefix(p, "github.com/nats-io/") || strings.HasPrefix(p, module+"/jetstream") && p != module+"/jetstream/pipeline" {
				t.Errorf("%s imports %s", file, p)
			}
		}
	}
	files, err := filepath.Glob("jetstream/pipeline/*.go")
	if err != nil {
		t.Fatal(err)
	}
	clock := map[string]bool{"Now": true, "Since": true, "Until": true, "After": true, "AfterFunc": true, "NewTimer": true, "NewTicker": true, "Sleep": true, "Tick": true}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == "time" && clock[sel.Sel.Name] {
					t.Errorf("%s: reads the clock (time.%s)", fset.Position(sel.Pos()), sel.Sel.Name)
				}
			}
			return true
		})
	}
}
