package cli

import (
	"errors"
	"slices"
	"strconv"
	"testing"
)

// allPages follows next tokens to the end (a server may end a page early
// by bytes), stops at want, and passes errors on.
func TestAllPages(t *testing.T) {
	pages := [][]int{{1, 2}, {3}, {4, 5, 6}}
	var calls []string
	fetch := func(token string, size int32) ([]int, string, error) {
		calls = append(calls, token)
		i := 0
		if token != "" {
			i, _ = strconv.Atoi(token)
		}
		next := ""
		if i+1 < len(pages) {
			next = strconv.Itoa(i + 1)
		}
		return pages[i], next, nil
	}
	if got, err := allPages(0, fetch); err != nil || !slices.Equal(got, []int{1, 2, 3, 4, 5, 6}) || !slices.Equal(calls, []string{"", "1", "2"}) {
		t.Errorf("all: %v %v, calls %q", got, err, calls)
	}
	calls = nil
	if got, err := allPages(3, fetch); err != nil || !slices.Equal(got, []int{1, 2, 3}) || len(calls) != 2 {
		t.Errorf("want 3: %v %v, calls %q", got, err, calls)
	}
	boom := errors.New("boom")
	if _, err := allPages(0, func(string, int32) ([]int, string, error) { return nil, "", boom }); !errors.Is(err, boom) {
		t.Errorf("error: %v", err)
	}
}
