package cli

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestAuditKindRefused checks that a --kind the authority never records is
// refused, naming every kind, before any call, and that a real one is sent.
func TestAuditKindRefused(t *testing.T) {
	f := &fakeAuthority{}
	cfg := serveFake(t, f)
	for _, cmd := range []string{"list", "export"} {
		code, _, errOut := runCLI(t, cfg, nil, "audit", cmd, "--as", "approver/alice", "--kind", "job.submitted")
		want := `airlock: --kind "job.submitted": the authority records no such kind; want one of ` + strings.Join(auditKinds, ", ") + "\n"
		if code != 2 || errOut != want {
			t.Errorf("audit %s --kind job.submitted: exit %d, stderr %q; want exit 2, %q", cmd, code, errOut, want)
		}
	}
	if got := f.sawTenants(); len(got) != 0 {
		t.Fatalf("an unknown kind reached the authority (%d requests)", len(got))
	}
	if code, _, errOut := runCLI(t, cfg, nil, "audit", "list", "--as", "approver/alice", "--kind", "rpc.denied"); code != 0 {
		t.Errorf("audit list --kind rpc.denied: exit %d\n%s", code, errOut)
	}
}

// TestAuditKindHelpNamesRealKinds checks that every kind the help of
// audit list and export names is one the authority records.
func TestAuditKindHelpNamesRealKinds(t *testing.T) {
	for _, cmd := range []string{"list", "export"} {
		root := newRoot(&globals{})
		sub, _, err := root.Find([]string{"audit", cmd})
		if err != nil {
			t.Fatal(err)
		}
		help := sub.Long + "\n" + sub.Flags().Lookup("kind").Usage
		for _, k := range regexp.MustCompile(`[a-z]{2,}\.[a-z_]{2,}`).FindAllString(help, -1) {
			if !slices.Contains(auditKinds, k) {
				t.Errorf("audit %s help names kind %q, which the authority never records:\n%s", cmd, k, help)
			}
		}
	}
}

// TestAuditKindsMatchTheAuthority holds auditKinds to the kinds the
// authority's code writes: the Kind of every audit.Event literal and every
// assignment to a Kind field of a string literal. When the kinds move into
// pkg/audit as constants, this test finds none and fails: use pkg/audit's
// list for auditKinds then, and delete the test.
func TestAuditKindsMatchTheAuthority(t *testing.T) {
	root := filepath.Join("..", "..", "..", "..", "services", "authority")
	written := map[string]string{} // kind -> first file:line that writes it
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "storetest" { // the store's conformance suite writes made-up kinds
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		file, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		note := func(e ast.Expr) {
			if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				k, _ := strconv.Unquote(lit.Value)
				if _, seen := written[k]; !seen {
					written[k] = fset.Position(lit.Pos()).String()
				}
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				if sel, ok := n.Type.(*ast.SelectorExpr); !ok || sel.Sel.Name != "Event" {
					return true
				}
				for _, el := range n.Elts {
					if kv, ok := el.(*ast.KeyValueExpr); ok {
						if key, ok := kv.Key.(*ast.Ident); ok && key.Name == "Kind" {
							note(kv.Value)
						}
					}
				}
			case *ast.AssignStmt:
				if len(n.Lhs) != len(n.Rhs) {
					return true
				}
				for i, lhs := range n.Lhs {
					if sel, ok := lhs.(*ast.SelectorExpr); ok && sel.Sel.Name == "Kind" {
						note(n.Rhs[i])
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(written) == 0 {
		t.Fatal("the authority writes no audit kind as a literal any more: take auditKinds from pkg/audit and delete this test")
	}
	for k, at := range written {
		if !slices.Contains(auditKinds, k) {
			t.Errorf("the authority writes audit kind %q (%s), which auditKinds lacks", k, at)
		}
	}
	for _, k := range auditKinds {
		if _, ok := written[k]; !ok {
			t.Errorf("auditKinds has %q, which the authority never writes", k)
		}
	}
}
