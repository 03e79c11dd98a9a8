package githistory

import (
	"errors"
	"fmt"
	"slices"
	"testing"
)

// graph is a commit graph: each commit's parents.
type graph map[string][]string

func (g graph) read(c string) ([]byte, error) {
	ps, ok := g[c]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrMissing, c)
	}
	obj := "tree t\n"
	for _, p := range ps {
		obj += "parent " + p + "\n"
	}
	return []byte(obj + "author a\n\nparent notaparent\n"), nil
}

func TestWalk(t *testing.T) {
	// m merges a and s; a and s both come from b; b from r (a root).
	g := graph{"m": {"a", "s"}, "a": {"b"}, "s": {"b"}, "b": {"r"}, "r": nil}
	for _, tc := range []struct {
		depth   int
		levels  [][]string
		shallow []string
	}{
		{1, [][]string{{"m"}}, []string{"m"}},
		{2, [][]string{{"m"}, {"a", "s"}}, []string{"a", "s"}},
		{3, [][]string{{"m"}, {"a", "s"}, {"b"}}, []string{"b"}},
		{4, [][]string{{"m"}, {"a", "s"}, {"b"}, {"r"}}, nil},
		{9, [][]string{{"m"}, {"a", "s"}, {"b"}, {"r"}}, nil},
	} {
		got, err := Walk("m", tc.depth, g.read)
		if err != nil {
			t.Fatalf("depth %d: %v", tc.depth, err)
		}
		if !slices.EqualFunc(got.Levels, tc.levels, slices.Equal) || !slices.Equal(got.Shallow, tc.shallow) {
			t.Errorf("depth %d: levels %v shallow %v; want %v and %v", tc.depth, got.Levels, got.Shallow, tc.levels, tc.shallow)
		}
	}
}

// TestWalkShallowCutsAllParents: a last-level commit with one parent
// inside the history and one beyond is shallow (git cuts all or none).
func TestWalkShallowCutsAllParents(t *testing.T) {
	g := graph{"h": {"x", "p"}, "x": {"c"}, "c": {"p", "far"}, "p": nil, "far": nil}
	got, err := Walk("h", 3, g.read)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Shallow, []string{"c"}) {
		t.Errorf("shallow %v, want [c]", got.Shallow)
	}
}

func TestWalkMissingParent(t *testing.T) {
	g := graph{"h": {"p"}}
	if _, err := Walk("h", 3, g.read); !errors.Is(err, ErrMissing) {
		t.Errorf("a missing parent within depth: %v", err)
	}
	if _, err := Walk("h", 1, g.read); err != nil {
		t.Errorf("a parent beyond depth is not read: %v", err)
	}
	if _, err := Walk("h", 0, g.read); err == nil {
		t.Error("depth 0 accepted")
	}
}
