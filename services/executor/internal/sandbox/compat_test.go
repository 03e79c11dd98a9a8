package sandbox

import (
	"context"
	"debug/elf"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/airlockhq/airlock/pkg/ocilayer"
	"github.com/airlockhq/airlock/test/registrytest"
)

// compatWorkload is a real program a job runs, as users' jobs do: the
// shell scripts of the other tests never start a thread, and under a
// runsc whose seccomp filter returned EPERM for clone3 no glibc program
// could (issue 8). Each one's output is something only the real work
// produces: a result its threads computed, a compiled program's answer,
// object ids git computed, `go test`'s verdict.
type compatWorkload struct {
	name string
	// dir, under testdata/compat, holds the workload's source files.
	dir string
	// host adds files built or fetched on the host, by source path.
	host func(t *testing.T) map[string]string
	// bins are the source paths of programs (made mode 0755).
	bins   []string
	cmd    []string
	env    map[string]string
	limits Limits
	want   []*regexp.Regexp
}

// compatLimits fit every workload but the Go test suite: gcc, git and the
// interpreters, with room for gVisor's own memory and threads.
var compatLimits = Limits{CPUMillis: 2000, MemoryBytes: 1 << 30, Pids: 512, DiskBytes: 512 << 20, Deadline: 2 * time.Minute}

// uuidModule is the real Go module whose own test suite a job runs.
const uuidModule = "github.com/google/uuid@v1.6.0"

func compatWorkloads(t *testing.T) []compatWorkload {
	goroot := hostGo(t, "env", "GOROOT")
	if !strings.HasPrefix(goroot, "/usr/") {
		t.Fatalf("the host's Go toolchain is at %s, outside /usr, which is all of the host's programs a sandbox sees", goroot)
	}
	for prog, pkg := range map[string]string{"python3": "python3", "gcc": "gcc", "make": "make", "git": "git", "node": "nodejs"} {
		if _, err := os.Stat("/usr/bin/" + prog); err != nil {
			t.Fatalf("the workloads run the host's /usr/bin/%s: %v: install Debian's %s (.ci/run does)", prog, err, pkg)
		}
	}
	goLimits := Limits{CPUMillis: 2000, MemoryBytes: 2 << 30, Pids: 1024, DiskBytes: 2 << 30, Deadline: 5 * time.Minute}
	return []compatWorkload{
		{
			name:   "python-threads",
			dir:    "python",
			cmd:    []string{"/usr/bin/python3", "threads.py"},
			limits: compatLimits,
			want: []*regexp.Regexp{
				wantLine(fmt.Sprintf("threads sum=%d", sumSquares(200000))),
				wantLine(fmt.Sprintf("pool sum=%d", sumSquares(200000))),
				wantLine("native threads>=4"),
			},
		},
		{
			name:   "gcc-pthreads",
			dir:    "pthread",
			cmd:    []string{"sh", "-c", "gcc -O2 -Wall -Werror -pthread -o /tmp/sum sum.c && /tmp/sum"},
			limits: compatLimits,
			want: []*regexp.Regexp{
				wantLine(fmt.Sprintf("pthreads sum=%d", sumSquares(1000000))),
				wantLine("posix_spawnp child ran"),
				wantLine("system child ran with 42"),
			},
		},
		{
			name:   "cgo",
			dir:    "cgo",
			host:   buildCgo,
			bins:   []string{"cgo"},
			cmd:    []string{"./cgo"},
			limits: compatLimits,
			want: []*regexp.Regexp{
				wantLine(fmt.Sprintf("cgo sum=%d", sumSquares(1000000))),
				// Eight goroutines blocked in C at once hold eight
				// threads, and the runtime's sysmon has one more.
				regexp.MustCompile(`(?m)^cgo Threads:\s+(9|[1-9][0-9]+)$`),
			},
		},
		{
			// With cgo the test binary links net's cgo resolver, so it
			// starts its threads with pthread_create too; the go
			// command and the compilers, pure Go, start children with
			// clone and would pass even where threads cannot start.
			name: "go-test-uuid",
			host: uuidSource,
			cmd:  []string{"go", "test", "./..."},
			env: map[string]string{
				"PATH":        goroot + "/bin:" + defaultEnv["PATH"],
				"GOTOOLCHAIN": "local", "GOPROXY": "off", "GOFLAGS": "-mod=mod",
				"GOCACHE": "/tmp/gocache", "GOPATH": "/tmp/gopath", "CGO_ENABLED": "1",
			},
			limits: goLimits,
			want:   []*regexp.Regexp{regexp.MustCompile(`(?m)^ok  \tgithub\.com/google/uuid\t`)},
		},
		{
			name:   "git",
			dir:    "git",
			cmd:    []string{"sh", "run.sh"},
			limits: compatLimits,
			// Fixed identities and dates make these ids the same
			// wherever git runs.
			want: []*regexp.Regexp{
				wantLine("commits=4"),
				wantLine("branches=feature main "),
				wantLine(" 1 file changed, 1 insertion(+)"),
				wantLine("555e125 feature: three"),
				wantLine("head=e8b472ca6e0248613ff089d625cbea3ab0de98a2"),
				wantLine("fsck ok"),
				wantLine("packed=in-pack: 11"),
				wantLine("cloned=e8b472ca6e0248613ff089d625cbea3ab0de98a2"),
			},
		},
		{
			name:   "make",
			dir:    "make",
			cmd:    []string{"sh", "-c", "make -j2 && cat result.txt && ls prog main.o fib.o"},
			limits: compatLimits,
			want: []*regexp.Regexp{
				wantLine("cc -O2 -Wall -Werror -c -o main.o main.c"),
				wantLine("cc -o prog main.o fib.o"),
				wantLine("fib(90)=2880067194370816120"),
				wantLine("fib.o"),
			},
		},
		{
			name:   "node-worker-threads",
			dir:    "node",
			cmd:    []string{"/usr/bin/node", "workers.js"},
			limits: compatLimits,
			want:   []*regexp.Regexp{wantLine(fmt.Sprintf("workers=4 sum=%d", sumSquares(1000000)))},
		},
	}
}

// TestCompat runs each workload under every runtime class, as
// CLASS/WORKLOAD, and asserts on what the work itself printed.
func TestCompat(t *testing.T) {
	e := newEnv(t)
	workloads := compatWorkloads(t)
	srcs := map[string]string{}
	for _, w := range workloads {
		srcs[w.name] = w.source(t, e)
	}
	// The subtests run one at a time, so each timing is the workload's own.
	var timings []string
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			for _, w := range workloads {
				t.Run(w.name, func(t *testing.T) {
					r := e.run(t, context.Background(), job{class: c, src: srcs[w.name], cmd: w.cmd, env: w.env, limits: &w.limits})
					timings = append(timings, fmt.Sprintf("%s/%s: wall %s, cpu %s, peak memory %d MiB, peak pids %d",
						c, w.name, r.res.Usage.WallTime.Round(time.Millisecond), r.res.Usage.CPUTime.Round(time.Millisecond),
						r.res.Usage.PeakMemoryBytes>>20, r.res.Usage.PeakPids))
					w.check(t, c, r)
				})
			}
		})
	}
	t.Logf("timings:\n%s", strings.Join(timings, "\n"))
}

// TestCompatImage runs the workloads (all but Python's, which the image
// does not carry) under every runtime class on a real Debian image built
// from Debian's packages with mmdebstrap (registrytest.DebianImage), its
// layers unpacked by pkg/ocilayer as the executor's image cache unpacks
// them. The programs are the image's, never the host's: its gcc, make,
// git, node and Go (Debian's, older than the host's), its glibc under the
// host-built cgo binary, and its /etc/os-release.
func TestCompatImage(t *testing.T) {
	e := newEnv(t)
	root := unpackedImage(t, e, registrytest.DebianImage(t, registrytest.ToolchainPackages...))
	var workloads []compatWorkload
	for _, w := range compatWorkloads(t) {
		switch w.name {
		case "python-threads":
			continue
		case "go-test-uuid":
			// The image's go, on the image's PATH.
			w.env = maps.Clone(w.env)
			delete(w.env, "PATH")
		}
		workloads = append(workloads, w)
	}
	workloads = append(workloads, compatWorkload{
		name:   "image-root",
		cmd:    []string{"sh", "-c", "cat /etc/os-release; go version; test -e /usr/local/go && echo host-go || echo no-host-go"},
		limits: compatLimits,
		want:   []*regexp.Regexp{wantLine("ID=debian"), wantLine("VERSION_CODENAME=bookworm"), regexp.MustCompile(`(?m)^go version go1\.19`), wantLine("no-host-go")},
	})
	srcs := map[string]string{}
	for _, w := range workloads {
		srcs[w.name] = w.source(t, e)
	}
	for _, c := range testClasses(t, e) {
		t.Run(string(c), func(t *testing.T) {
			for _, w := range workloads {
				t.Run(w.name, func(t *testing.T) {
					r := e.run(t, context.Background(), job{class: c, src: srcs[w.name], cmd: w.cmd, env: w.env, limits: &w.limits, image: root})
					w.check(t, c, r)
				})
			}
		})
	}
}

// unpackedImage unpacks img's layers with pkg/ocilayer, owned by the
// sandboxes' host ids, as the executor's image cache does.
func unpackedImage(t *testing.T, e *env, img v1.Image) *ImageRoot {
	t.Helper()
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	root := &ImageRoot{Digest: d.String()}
	for i, l := range layers {
		mt, err := l.MediaType()
		if err != nil {
			t.Fatal(err)
		}
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(e.base, fmt.Sprintf("image-layer-%d", i))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		began := time.Now()
		st, err := ocilayer.Unpack(t.Context(), rc, string(mt), dir, ocilayer.Options{UIDBase: e.cfg.UIDBase, IDRange: IDRange})
		rc.Close()
		if err != nil {
			t.Fatalf("unpack layer %d: %v", i, err)
		}
		t.Logf("layer %d: %d entries, %d MiB unpacked in %s", i, st.Entries, st.Bytes>>20, time.Since(began).Round(time.Millisecond))
		root.Layers = append(root.Layers, dir)
	}
	return root
}

// source makes the workload's source tree: its testdata directory and
// what its host step adds.
func (w compatWorkload) source(t *testing.T, e *env) string {
	t.Helper()
	files := map[string]string{}
	if w.dir != "" {
		files = readTree(t, filepath.Join("testdata", "compat", w.dir))
	}
	if w.host != nil {
		for name, content := range w.host(t) {
			files[name] = content
		}
	}
	src := e.source(t, files)
	for _, name := range w.bins {
		if err := os.Chmod(filepath.Join(src, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return src
}

// check fails the test, naming the class and the workload and showing the
// end of the job's output, unless the job exited 0 and printed every line
// the workload wants.
func (w compatWorkload) check(t *testing.T, c Class, r ran) {
	t.Helper()
	var why []string
	switch {
	case r.err != nil:
		why = append(why, fmt.Sprintf("Run: %v", r.err))
	case r.res.Reason != ReasonExited || r.res.ExitCode != 0:
		why = append(why, fmt.Sprintf("ended %s with exit %d (%s), want exited 0", r.res.Reason, r.res.ExitCode, r.res.Message))
	}
	for _, re := range w.want {
		if !re.MatchString(r.stdout) {
			why = append(why, fmt.Sprintf("stdout has no line matching %s", re))
		}
	}
	if len(why) > 0 {
		t.Fatalf("%s under runtime class %s failed:\n%s\nstdout:\n%s\nstderr:\n%s",
			w.name, c, strings.Join(why, "\n"), ends(r.stdout), ends(r.stderr))
	}
}

// wantLine matches s as a whole line.
func wantLine(s string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(s) + `$`)
}

// sumSquares is the sum of k*k for k in [0, n), which the threaded
// workloads compute in parts.
func sumSquares(n uint64) uint64 { return (n - 1) * n * (2*n - 1) / 6 }

// ends is s, or its start and its end when it is long: a crash's reason
// comes first and a register dump after it; a test run's verdict comes
// last.
func ends(s string) string {
	const head, tail = 1500, 2500
	if len(s) <= head+tail {
		return s
	}
	return s[:head] + "\n[...]\n" + s[len(s)-tail:]
}

// readTree reads every regular file under dir, by slash-separated path
// relative to it.
func readTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		files[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// hostGo runs the host's go command and returns its trimmed output. Cgo is
// on and GOFLAGS empty whatever the caller's environment says: the cgo
// workload is built with it.
func hostGo(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("go", args...)
	cmd.Env = append(os.Environ(), "GOFLAGS=", "CGO_ENABLED=1")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("go %s: %v: %s", strings.Join(args, " "), err, stderr)
	}
	return strings.TrimSpace(string(out))
}

// buildCgo builds testdata/compat/cgo on the host with cgo: a binary
// linked against the host's glibc, as the sandbox's /usr provides it.
func buildCgo(t *testing.T) map[string]string {
	bin := filepath.Join(t.TempDir(), "cgo")
	hostGo(t, "build", "-o", bin, "./testdata/compat/cgo")
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	libs, err := f.ImportedLibraries()
	f.Close()
	if err != nil || !slices.Contains(libs, "libc.so.6") {
		t.Fatalf("the cgo workload links %v (%v), want glibc's libc.so.6", libs, err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{"cgo": string(b)}
}

// uuidSource is the module uuidModule, from the module cache (it is in this
// module's go.sum), as the root of a source tree.
func uuidSource(t *testing.T) map[string]string {
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal([]byte(hostGo(t, "mod", "download", "-json", uuidModule)), &mod); err != nil || mod.Dir == "" {
		t.Fatalf("go mod download %s: %v %s", uuidModule, err, mod.Error)
	}
	files := readTree(t, mod.Dir)
	// Upstream's TestVersion6 fails now and then wherever it runs ("time
	// reversed": a v6 UUID's time is not monotonic, google/uuid#199); it
	// says nothing of the sandbox, so it is renamed out of the suite.
	const flaky = "func TestVersion6(t *testing.T) {"
	if !strings.Contains(files["uuid_test.go"], flaky) {
		t.Fatalf("%s: uuid_test.go has no %q any more: look again at what to leave out", uuidModule, flaky)
	}
	files["uuid_test.go"] = strings.Replace(files["uuid_test.go"], flaky, "func flakyVersion6(t *testing.T) {", 1)
	return files
}
