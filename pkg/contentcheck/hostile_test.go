package contentcheck

import (
	"io"
	"strings"
	"testing"
)

type want struct{ rule, path string }

// Every row is a patch an agent could hand in to reach outside what may
// land; each must be refused with the rule named, on the path named.
func TestHostilePatches(t *testing.T) {
	long := strings.Repeat("d/", 2100) + "x"
	for _, tc := range []struct {
		name  string
		patch []byte
		pol   Policy
		base  []TreeEntry
		want  []want
	}{
		{name: "parent component", patch: patchOf(addFile("../x", ModeFile, "x")), want: []want{{RulePathTraversal, "../x"}}},
		{name: "parent inside", patch: patchOf(addFile("a/../../x", ModeFile, "x")), want: []want{{RulePathTraversal, "a/../../x"}}},
		{name: "dot component", patch: patchOf(addFile("a/./x", ModeFile, "x")), want: []want{{RulePathTraversal, "a/./x"}}},
		{name: "absolute", patch: patchOf(addFile("/etc/x", ModeFile, "x")), want: []want{{RulePathAbsolute, "/etc/x"}}},
		{name: "drive letter", patch: patchOf(addFile("C:/x", ModeFile, "x")), want: []want{{RulePathAbsolute, "C:/x"}}},
		{name: "empty component", patch: patchOf(addFile("a//x", ModeFile, "x")), want: []want{{RulePathEmpty, "a//x"}}},
		{name: ".git/config", patch: patchOf(addFile(".git/config", ModeFile, "[core]")), want: []want{{RulePathDotGit, ".git/config"}}},
		{name: ".GIT/hooks/x", patch: patchOf(addFile(".GIT/hooks/x", ModeExecutable, "#!/bin/sh")), want: []want{{RulePathDotGit, ".GIT/hooks/x"}}},
		{name: "nested .git", patch: patchOf(addFile("sub/.Git/HEAD", ModeFile, "x")), want: []want{{RulePathDotGit, "sub/.Git/HEAD"}}},
		{name: "NTFS trailing dot", patch: patchOf(addFile(".git./x", ModeFile, "x")), want: []want{{RulePathDotGit, ".git./x"}}},
		{name: "NTFS trailing space", patch: patchOf(addFile(".git /x", ModeFile, "x")), want: []want{{RulePathDotGit, ".git /x"}}},
		{name: "NTFS trailing dots and spaces", patch: patchOf(addFile(".git . ./x", ModeFile, "x")), want: []want{{RulePathDotGit, ".git . ./x"}}},
		{name: "NTFS short name", patch: patchOf(addFile("git~1/x", ModeFile, "x")), want: []want{{RulePathDotGit, "git~1/x"}}},
		{name: "NTFS short name upper", patch: patchOf(addFile("GIT~1/config", ModeFile, "x")), want: []want{{RulePathDotGit, "GIT~1/config"}}},
		{name: "NTFS index stream", patch: patchOf(addFile(".git::$INDEX_ALLOCATION/x", ModeFile, "x")), want: []want{{RulePathDotGit, ".git::$INDEX_ALLOCATION/x"}}},
		{name: "NTFS data stream", patch: patchOf(addFile(".git:stream", ModeFile, "x")), want: []want{{RulePathDotGit, ".git:stream"}}},
		{name: "HFS ignored code point", patch: patchOf(addFile(".g\u200cit/x", ModeFile, "x")), want: []want{{RulePathDotGit, ".g\u200cit/x"}}},
		{name: "HFS byte order mark", patch: patchOf(addFile("\ufeff.git/x", ModeFile, "x")), want: []want{{RulePathDotGit, "\ufeff.git/x"}}},
		{name: "backslash", patch: patchOf(addFile(`a\b`, ModeFile, "x")), want: []want{{RulePathBackslash, `a\b`}}},
		{name: "backslash .git", patch: patchOf(addFile(`x\.git\config`, ModeFile, "x")), want: []want{{RulePathBackslash, `x\.git\config`}}},
		{name: "newline in name", patch: patchOf(addFile("a\nb", ModeFile, "x")), want: []want{{RulePathControl, "a\nb"}}},
		{name: "carriage return in name", patch: patchOf(addFile("a\rb", ModeFile, "x")), want: []want{{RulePathControl, "a\rb"}}},
		{name: "escape in name", patch: patchOf(addFile("a\x1b[2Jb", ModeFile, "x")), want: []want{{RulePathControl, "a\x1b[2Jb"}}},
		{name: "raw C1 byte in name", patch: patchOf(addFile("a\x9bb", ModeFile, "x")), want: []want{{RulePathControl, "a\x9bb"}}},
		{name: "path too long", patch: patchOf(addFile(long, ModeFile, "x")), want: []want{{RulePathTooLong, long}}},
		{name: "component too long", patch: patchOf(addFile(strings.Repeat("n", 256), ModeFile, "x")), want: []want{{RulePathTooLong, strings.Repeat("n", 256)}}},
		{name: "path longer than the policy's cap", patch: patchOf(addFile("abcdefghij/k", ModeFile, "x")), pol: Policy{MaxPathBytes: 8}, want: []want{{RulePathTooLong, "abcdefghij/k"}}},

		{name: "symlink to /etc/shadow", patch: patchOf(symlink("shadow", "/etc/shadow")), want: []want{{RuleSymlinkEscapes, "shadow"}}},
		{name: "symlink up and out", patch: patchOf(symlink("a/link", "../../x")), want: []want{{RuleSymlinkEscapes, "a/link"}}},
		{name: "symlink out and back in", patch: patchOf(symlink("link", "../repo/x")), want: []want{{RuleSymlinkEscapes, "link"}}},
		{name: "symlink out through another symlink", patch: patchOf(symlink("s", "."), symlink("t", "s/../x")), want: []want{{RuleSymlinkEscapes, "t"}}},
		{name: "symlink out through a base symlink", patch: patchOf(symlink("t", "up/../../x")),
			base: []TreeEntry{{Path: "up", Mode: ModeSymlink, Target: "."}}, want: []want{{RuleSymlinkEscapes, "t"}}},
		{name: "symlink through a base symlink of unknown target", patch: patchOf(symlink("t", "up/x")),
			base: []TreeEntry{{Path: "up", Mode: ModeSymlink}}, want: []want{{RuleSymlinkEscapes, "t"}}},
		{name: "symlink loop", patch: patchOf(symlink("a", "b/x"), symlink("b", "a/y")), want: []want{{RuleSymlinkEscapes, "a"}}},
		{name: "symlink with a backslash target", patch: patchOf(symlink("w", `..\..\x`)), want: []want{{RuleSymlinkEscapes, "w"}}},
		{name: "symlink into .git", patch: patchOf(symlink("hooks", ".git/hooks")), want: []want{{RuleSymlinkIntoGit, "hooks"}}},
		{name: "symlink into .GIT from below", patch: patchOf(symlink("a/cfg", "../.GIT/config")), want: []want{{RuleSymlinkIntoGit, "a/cfg"}}},
		{name: "symlink into git~1 through a symlink", patch: patchOf(symlink("g", "git~1"), symlink("c", "g/config")), want: []want{{RuleSymlinkIntoGit, "g"}, {RuleSymlinkIntoGit, "c"}}},
		{name: ".gitmodules as symlink", patch: patchOf(symlink(".gitmodules", "x")), want: []want{{RuleSymlinkGitMeta, ".gitmodules"}, {RuleGitmodules, ".gitmodules"}}},
		{name: ".gitattributes as symlink", patch: patchOf(symlink("sub/.gitattributes", "../attrs")), want: []want{{RuleSymlinkGitMeta, "sub/.gitattributes"}}},
		{name: ".gitignore as symlink, NTFS short name", patch: patchOf(symlink("GITIGN~1", "x")), want: []want{{RuleSymlinkGitMeta, "GITIGN~1"}}},
		{name: ".gitattributes as symlink, HFS", patch: patchOf(symlink(".gitattribute\u200ds", "x")), want: []want{{RuleSymlinkGitMeta, ".gitattribute\u200ds"}}},
		{name: "file beneath a symlinked dir", patch: patchOf(symlink("d", "elsewhere"), addFile("d/x", ModeFile, "x")), want: []want{{RuleBeneathSymlink, "d/x"}}},
		{name: "file beneath a base symlink", patch: patchOf(addFile("d/e/x", ModeFile, "x")),
			base: []TreeEntry{{Path: "d/e", Mode: ModeSymlink, Target: "f"}}, want: []want{{RuleBeneathSymlink, "d/e/x"}}},
		{name: "file beneath a symlink, by case", patch: patchOf(symlink("D", "elsewhere"), addFile("d/x", ModeFile, "x")), want: []want{{RulePathCaseCollision, "d"}}},
		{name: "gitlink", patch: patchOf(addFile("sub", ModeGitlink, "Subproject commit "+someID)), want: []want{{RuleGitlink, "sub"}}},
		{name: ".gitmodules with a dash url", patch: patchOf(addFile(".gitmodules", ModeFile, `[submodule "x"]`, "\tpath = x", "\turl = -oProxyCommand=touch${IFS}/tmp/pwned")),
			want: []want{{RuleGitmodules, ".gitmodules"}}},
		{name: ".gitmodules removed", patch: patchOf(deleteFile(".gitmodules", `[submodule "x"]`)), want: []want{{RuleGitmodules, ".gitmodules"}}},
		{name: "README and readme", patch: patchOf(addFile("README", ModeFile, "a"), addFile("readme", ModeFile, "b")),
			want: []want{{RulePathCaseCollision, "README"}, {RulePathCaseCollision, "readme"}}},
		{name: "case collision with the base", patch: patchOf(addFile("docs/b", ModeFile, "b")),
			base: []TreeEntry{{Path: "Docs/a", Mode: ModeFile}}, want: []want{{RulePathCaseCollision, "docs"}}},
		{name: "Unicode case and normal form", patch: patchOf(addFile("caf\u00e9", ModeFile, "a"), addFile("CAFE\u0301", ModeFile, "b")),
			want: []want{{RulePathCaseCollision, "caf\u00e9"}}},
		{name: "a 50 MB binary", patch: patchOf(binaryFile(t, "big.bin", 50<<20, zeros{})),
			want: []want{{RuleFileTooLarge, "big.bin"}, {RuleFileBinary, "big.bin"}}},
		{name: "a text file over the cap", patch: patchOf(addFile("big.txt", ModeFile, strings.Repeat("x", 600), strings.Repeat("y", 600))),
			pol: Policy{MaxFileBytes: 1000}, want: []want{{RuleFileTooLarge, "big.txt"}}},
		{name: "a binary not allowed", patch: patchOf(binaryFile(t, "img.png", 100, zeros{})), want: []want{{RuleFileBinary, "img.png"}}},
		{name: "a binary without content", patch: patchOf("diff --git a/b.bin b/b.bin\nnew file mode 100644\nindex " + zeroID + ".." + someID + "\nBinary files /dev/null and b/b.bin differ\n"),
			pol: Policy{AllowBinary: true}, want: []want{{RuleFileBinary, "b.bin"}}},
		{name: "workflow not allowed", patch: patchOf(addFile(".github/workflows/ci.yml", ModeFile, "on: push")), want: []want{{RulePathProtected, ".github/workflows/ci.yml"}}},
		{name: "workflow by case", patch: patchOf(addFile(".GitHub/Workflows/ci.yml", ModeFile, "on: push")), want: []want{{RulePathProtected, ".GitHub/Workflows/ci.yml"}}},
		{name: "workflows dir as symlink", patch: patchOf(symlink(".github/workflows", "../ci")), want: []want{{RulePathProtected, ".github/workflows"}}},
		{name: "CODEOWNERS in docs", patch: patchOf(addFile("docs/CODEOWNERS", ModeFile, "* @me")), want: []want{{RulePathProtected, "docs/CODEOWNERS"}}},
		{name: "CODEOWNERS deleted", patch: patchOf(deleteFile("CODEOWNERS", "* @team")), want: []want{{RulePathProtected, "CODEOWNERS"}}},
		{name: "gitleaks config", patch: patchOf(addFile(".gitleaksignore", ModeFile, "x:y:1")), want: []want{{RulePathProtected, ".gitleaksignore"}}},
		{name: "a tenant's protected glob", patch: patchOf(addFile("deploy/prod/values.yaml", ModeFile, "x: 1")),
			pol: Policy{Protected: []string{"deploy/**"}}, want: []want{{RulePathProtected, "deploy/prod/values.yaml"}}},
		{name: "allowed elsewhere, not here", patch: patchOf(addFile(".github/workflows/ci.yml", ModeFile, "on: push")),
			pol: Policy{AllowProtected: []string{"CODEOWNERS"}}, want: []want{{RulePathProtected, ".github/workflows/ci.yml"}}},
		{name: "not a patch", patch: []byte("rm -rf /\n"), want: []want{{RulePatchMalformed, ""}}},
		{name: "junk between sections", patch: patchOf(addFile("a", ModeFile, "x"), "--- a/b\n+++ b/b\n@@ -1 +1 @@\n-x\n+y\n"), want: []want{{RulePatchMalformed, ""}}},
		{name: "a rename", patch: []byte("diff --git a/x b/.git/config\nsimilarity index 100%\nrename from x\nrename to .git/config\n"), want: []want{{RulePatchMalformed, ""}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := check(t, tc.pol, Input{Patch: tc.patch, Base: tc.base})
			for _, w := range tc.want {
				if !hasFinding(fs, w.rule, w.path) {
					t.Errorf("no %s finding for %q; got%s", w.rule, w.path, show(fs))
				}
			}
		})
	}
}

// Ordinary content, and protected paths the target allows, pass: the
// rules above are not refusing everything.
func TestCleanPatches(t *testing.T) {
	for _, tc := range []struct {
		name  string
		patch []byte
		pol   Policy
		base  []TreeEntry
	}{
		{name: "ordinary change", patch: patchOf(
			addFile("cmd/tool/main.go", ModeFile, "package main", "", "func main() {}"),
			modifyFile("README.md", 10, []string{"old words"}, []string{"new words", "more"}),
			deleteFile("obsolete.txt", "gone"),
			addFile("scripts/run.sh", ModeExecutable, "#!/bin/sh", "exec true"),
			addFile("empty", ModeFile),
			symlink("docs/latest", "v2/index.md"),
			symlink("link-up", "docs/../README.md"),
			addFile(".gitignore", ModeFile, "/bin/"),
			addFile("sub/.gitattributes", ModeFile, "*.go diff=golang"),
			addFile("name with spaces.txt", ModeFile, "x"),
			addFile("gitx/.gitkeep", ModeFile),
			addFile(".github/dependabot.yml", ModeFile, "version: 2"),
			addFile("docs/notes.md", ModeFile, "the api is described in api.md, see the auth section"),
		), base: []TreeEntry{{Path: "README.md", Mode: ModeFile}, {Path: "obsolete.txt", Mode: ModeFile}, {Path: "v2/index.md", Mode: ModeFile}}},
		{name: "workflow allowed", patch: patchOf(addFile(".github/workflows/ci.yml", ModeFile, "on: push")),
			pol: Policy{AllowProtected: []string{".github/workflows/**"}}},
		{name: "one workflow allowed", patch: patchOf(addFile(".github/workflows/ci.yml", ModeFile, "on: push")),
			pol: Policy{AllowProtected: []string{".github/workflows/ci.yml"}}},
		{name: "binary allowed", patch: patchOf(binaryFile(t, "img.png", 100, zeros{})), pol: Policy{AllowBinary: true}},
		{name: "collision already in the base", patch: patchOf(addFile("src/x", ModeFile, "x")),
			base: []TreeEntry{{Path: "Makefile", Mode: ModeFile}, {Path: "makefile", Mode: ModeFile}}},
		{name: "symlink replaced by a file", patch: patchOf(
			"diff --git a/d b/d\ndeleted file mode 120000\nindex "+someID+".."+zeroID+"\n--- a/d\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\n\\ No newline at end of file\n",
			addFile("d/x", ModeFile, "x")), base: []TreeEntry{{Path: "d", Mode: ModeSymlink, Target: "x"}}},
		{name: "empty patch", patch: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if fs := check(t, tc.pol, Input{Patch: tc.patch, Base: tc.base}); len(fs) != 0 {
				t.Errorf("findings for clean content:%s", show(fs))
			}
		})
	}
}

// A patch never makes the parser or the checks panic, whatever its bytes;
// the fuzz corpus starts from the hostile patches above.
func FuzzParsePatch(f *testing.F) {
	for _, s := range []string{
		addFile("a", ModeFile, "x", "y"),
		symlink("l", "../x") + addFile("l/x", ModeFile, "x"),
		deleteFile("CODEOWNERS", "x"),
		modifyFile("m", 5, []string{"a"}, []string{"b", "c"}),
		addFile("a\nb", ModeFile, "x"),
		addFile(".gitmodules", ModeFile, "url = -x"),
		binaryFile(f, "b", 200, zeros{}),
		binaryDelta(f, "d", []byte("\x00inserted bytes")),
		"diff --git \"a/x\\ty\" \"b/x\\ty\"\nold mode 100644\nnew mode 100755\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := ParsePatch(data)
		if err != nil {
			return
		}
		for _, fp := range p.Files {
			if fp.OldPath == "" && fp.NewPath == "" {
				t.Fatal("a section with no path")
			}
			for i, l := range fp.Added {
				if l.Num < 1 || i > 0 && l.Num <= fp.Added[i-1].Num {
					t.Fatalf("added line numbers out of order: %d after %v", l.Num, fp.Added[:i])
				}
			}
			if fp.bin != nil {
				io.Copy(io.Discard, io.LimitReader(fp.bin.content(), 1<<20))
			}
		}
		r := newReport()
		checkPaths(Policy{}.effective(), p, nil, r)
	})
}
