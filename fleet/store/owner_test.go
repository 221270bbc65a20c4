package store

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

// sqlImports are the packages that let code talk SQL to a database.
var sqlImports = []string{"database/sql", "github.com/mattn/go-sqlite3", "github.com/jackc/pgx"}

// TestOnlyStoreWritesSQL: fleet/store is the one owner of the schema and
// its queries (issue 20). No program file outside it imports a SQL
// driver or database/sql, or calls Store.DB(); tests may, to inject
// faults. The check reads the repository's sources, so it fails as soon
// as someone adds such a use.
func TestOnlyStoreWritesSQL(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	self, _ := filepath.Abs(".")
	fset := token.NewFileSet()
	files := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == self || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "out" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		files++
		rel, _ := filepath.Rel(root, path)
		for _, imp := range f.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			for _, s := range sqlImports {
				if p == s || strings.HasPrefix(p, s+"/") {
					t.Errorf("%s imports %s: SQL belongs in fleet/store", rel, p)
				}
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if c, ok := n.(*ast.CallExpr); ok && len(c.Args) == 0 {
				if sel, ok := c.Fun.(*ast.SelectorExpr); ok && sel.Sel.Name == "DB" {
					t.Errorf("%s: %s calls .DB(): SQL belongs in fleet/store", rel, fset.Position(c.Pos()))
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files < 50 {
		t.Fatalf("read only %d program files under %s: is the walk broken?", files, root)
	}
}
