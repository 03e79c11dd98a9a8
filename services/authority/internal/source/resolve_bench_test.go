package source_test

import (
	"testing"
)

// BenchmarkResolve is one submission's revision resolution against a real
// git server over TLS (gitservetest, the dev stack's server), once the
// mirror holds the commit: a branch (one ref listing), the commit's SHA
// (nothing sent), and, as the baseline in the same run, what Resolve did
// before it ran in-process — git fetch into the mirror, two rev-parses and
// an update-ref, four git processes and the fetch's round trips.
func BenchmarkResolve(b *testing.B) {
	r := newRepo(b)
	repo, _, _ := httpsRemote(b, r)
	s, _, _ := newSource(b)
	main := r.RevParse("main")
	if _, err := s.Resolve(b.Context(), repo, "main"); err != nil {
		b.Fatal(err)
	}
	b.Run("via=branch", func(b *testing.B) {
		for b.Loop() {
			if got, err := s.Resolve(b.Context(), repo, "main"); err != nil || got.Commit != main {
				b.Fatalf("%v %v", got, err)
			}
		}
	})
	b.Run("via=sha", func(b *testing.B) {
		for b.Loop() {
			if got, err := s.Resolve(b.Context(), repo, main); err != nil || got.Commit != main {
				b.Fatalf("%v %v", got, err)
			}
		}
	})
	b.Run("via=git-processes", func(b *testing.B) {
		for b.Loop() {
			if got, err := s.ResolveWithGit(b.Context(), repo, "main"); err != nil || got != main {
				b.Fatalf("%v %v", got, err)
			}
		}
	})
}
