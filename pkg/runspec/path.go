package runspec

import (
	"fmt"
	"path/filepath"
	"strings"
)

// maxPath bounds a job PATH (sandbox.path).
const maxPath = 4096

// ValidPath checks a PATH for jobs: at most 4096 bytes of absolute, clean
// directories separated by ':', with no empty entry (which a shell would
// search as the current directory, /work, where the job's own files
// could stand in for a command) and no control character.
func ValidPath(p string) error {
	if len(p) > maxPath {
		return fmt.Errorf("%d bytes: at most %d", len(p), maxPath)
	}
	for i, dir := range strings.Split(p, ":") {
		switch {
		case dir == "":
			return fmt.Errorf("entry %d is empty (an empty entry, as in a leading, trailing or doubled ':', means the current directory)", i+1)
		case strings.ContainsFunc(dir, func(r rune) bool { return r < 0x20 || r == 0x7f }):
			return fmt.Errorf("entry %d %q has a control character", i+1, dir)
		case !filepath.IsAbs(dir) || filepath.Clean(dir) != dir:
			return fmt.Errorf("entry %d %q: want a clean absolute directory such as /usr/local/go/bin", i+1, dir)
		}
	}
	return nil
}
