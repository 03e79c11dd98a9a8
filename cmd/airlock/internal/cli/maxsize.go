package cli

import (
	"fmt"

	"github.com/spf13/cobra"
)

// defaultMaxDownload bounds a download unless --max-size says otherwise:
// the most one upload may be, so a file can come out as it could go in.
// A session's file can be sparse: a few blocks inside the sandbox and any
// size on the way out.
const defaultMaxDownload = "1GiB"

// maxSizeFlag adds --max-size to cmd and returns what gives its value in
// bytes, or a usage error naming the flag.
func maxSizeFlag(cmd *cobra.Command) func() (int64, error) {
	s := cmd.Flags().String("max-size", defaultMaxDownload,
		"the largest file a download takes, e.g. 10GiB; a larger one is refused before anything is written")
	return func() (int64, error) {
		n, err := parseSize("--max-size", *s)
		if err != nil {
			return 0, err
		}
		if n <= 0 {
			return 0, usageError{fmt.Errorf("--max-size %q: must be more than 0 bytes", *s)}
		}
		return n, nil
	}
}

// overMaxSize refuses a download named what (escaped) whose announced size
// is past max; the download then takes no more bytes than it announced.
func overMaxSize(what string, size, max int64) error {
	if size <= max {
		return nil
	}
	return fmt.Errorf("%s: %d bytes, over --max-size of %d bytes; nothing was written (a larger --max-size takes it)", what, size, max)
}
