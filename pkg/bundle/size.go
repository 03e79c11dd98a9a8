package bundle

import "fmt"

// What leaves a sandbox (/work's changes through the patch, /out through
// the bundle) is counted by apparent size: a sparse or hole-punched file
// takes few blocks inside the job, but git reads it whole and the bundle
// copies it whole. The executor bounds the sum by the job's disk limit, so
// neither its memory nor its disk pays for more than the job could have
// written for real. Sizes are taken with lstat; nothing is read to count.

// Tally adds up the apparent sizes of what is to leave a sandbox against
// Limit. Limit 0 or less is no bound (tools and tests; the executor always
// sets one).
type Tally struct {
	Limit int64
	// Total is every size added so far.
	Total int64
	// Largest is the largest file added, as the job sees it, and Size its
	// apparent size.
	Largest string
	Size    int64
}

// Add counts one file: path as the job sees it (/out/big), size its
// apparent size. A nil Tally counts nothing.
func (t *Tally) Add(path string, size int64) {
	if t == nil {
		return
	}
	t.Total += size
	if size > t.Size || t.Largest == "" {
		t.Largest, t.Size = path, size
	}
}

// Err is a *TooLargeError once Total is over Limit.
func (t *Tally) Err() error {
	if t == nil || t.Limit <= 0 || t.Total <= t.Limit {
		return nil
	}
	return &TooLargeError{Path: t.Largest, Size: t.Size, Total: t.Total, Limit: t.Limit}
}

// TooLargeError is what leaving a sandbox would have cost past its bound.
// It names paths as the job sees them, never a host path.
type TooLargeError struct {
	// Path is the largest file, as the job sees it; Size its apparent size.
	Path string
	Size int64
	// Total is the apparent sizes counted, Limit the bound they passed.
	Total, Limit int64
}

func (e *TooLargeError) Error() string {
	return fmt.Sprintf("the apparent sizes of /work's changes and /out add up to at least %d bytes, over the disk limit of %d bytes "+
		"(a sparse or hole-punched file counts at its full size); the largest is %s, %d bytes", e.Total, e.Limit, e.Path, e.Size)
}
