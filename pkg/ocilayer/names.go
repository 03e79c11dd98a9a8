package ocilayer

import (
	"path"
	"strings"
)

// Limits of Linux paths: PATH_MAX and NAME_MAX.
const (
	maxPathBytes = 4096
	maxNameBytes = 255
)

// cleanName is an entry name relative to the layer root, "" for the root
// itself ("./"); it refuses absolute names and ".." components rather than
// rewrite them, since no well-formed layer carries them.
func cleanName(name string) (string, error) {
	if name == "" {
		return "", hostile("empty name")
	}
	if err := checkText(name); err != nil {
		return "", err
	}
	if strings.HasPrefix(name, "/") {
		return "", hostile("absolute path")
	}
	parts := strings.Split(name, "/")
	kept := parts[:0]
	for _, p := range parts {
		switch {
		case p == "" || p == ".":
		case p == "..":
			return "", hostile("path leaves the layer")
		case len(p) > maxNameBytes:
			return "", hostile("path component longer than %d bytes", maxNameBytes)
		default:
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, "/"), nil
}

// checkText refuses a name or link target the kernel could not take.
func checkText(s string) error {
	if strings.IndexByte(s, 0) >= 0 {
		return hostile("NUL byte in name")
	}
	if len(s) > maxPathBytes {
		return hostile("name longer than %d bytes", maxPathBytes)
	}
	return nil
}

// checkSymlink refuses a relative target that climbs above the layer root
// from the directory of the link at rel, read lexically. An absolute
// target resolves in the container's root, so it is kept.
func checkSymlink(rel, target string) error {
	if target == "" {
		return hostile("empty link target")
	}
	if err := checkText(target); err != nil {
		return err
	}
	if strings.HasPrefix(target, "/") {
		return nil
	}
	depth := 0
	if dir := path.Dir(rel); dir != "." {
		depth = strings.Count(dir, "/") + 1
	}
	for _, p := range strings.Split(target, "/") {
		switch p {
		case "", ".":
		case "..":
			depth--
			if depth < 0 {
				return hostile("link leaves the layer")
			}
		default:
			depth++
		}
	}
	return nil
}

// splitName is rel's parent directory ("" for the root) and last component.
func splitName(rel string) (dir, base string) {
	i := strings.LastIndexByte(rel, '/')
	if i < 0 {
		return "", rel
	}
	return rel[:i], rel[i+1:]
}
