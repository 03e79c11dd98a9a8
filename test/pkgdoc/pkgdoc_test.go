// Package pkgdoc checks a house rule: every package of ours (generated code
// aside) has exactly one package doc comment saying what it owns.
package pkgdoc

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestEveryPackageHasOneDocComment(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		switch {
		case rel == "proto" || strings.HasPrefix(rel, "proto"+string(filepath.Separator)),
			rel == "tools", rel == "bin", strings.HasPrefix(d.Name(), "."), d.Name() == "testdata":
			return filepath.SkipDir
		}
		fset := token.NewFileSet()
		pkgs, err := parser.ParseDir(fset, path, func(fi os.FileInfo) bool {
			return !strings.HasSuffix(fi.Name(), "_test.go")
		}, parser.ParseComments|parser.PackageClauseOnly)
		if err != nil {
			return err
		}
		for name, pkg := range pkgs {
			checked++
			docs := 0
			for _, f := range pkg.Files {
				if f.Doc != nil {
					docs++
				}
			}
			if docs != 1 {
				t.Errorf("%s (package %s): %d files carry a package doc comment, want exactly 1", rel, name, docs)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 10 {
		t.Fatalf("checked only %d packages; the walk is broken", checked)
	}
}
