package templates

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportsOnlyTheViewModels keeps the dashboard's one direction: web
// imports web/templates, and the components see nothing of the module but the
// display-ready view models in web/view. An import of web (or of the
// controller) from here would run back up the tree.
func TestImportsOnlyTheViewModels(t *testing.T) {
	const module = "github.com/discord-pxe/dpxe/"
	allowed := map[string]bool{module + "web/view": true}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no Go files found beside the test")
	}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, name, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range f.Imports {
			path, err := strconv.Unquote(imp.Path.Value)
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(path, module) && !allowed[path] {
				t.Errorf("%s imports %s: web/templates may import only web/view from this module", name, path)
			}
		}
	}
}
