package streamwal_test

import (
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
