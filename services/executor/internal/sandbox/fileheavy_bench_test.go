package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// BenchmarkRunscFileHeavy runs file-heavy jobs under runc and under runsc
// with each of gVisor's filesystem options worth measuring (issue 27 §6),
// so their ratios to runc come from one run on one machine:
//
//	go test -c -o /tmp/sandbox.test ./services/executor/internal/sandbox/
//	for i in 1 2 3 4 5; do (cd services/executor/internal/sandbox &&
//	  /tmp/sandbox.test -test.run '^$' -test.bench RunscFileHeavy -test.benchtime 1x); done > fh.txt
//	benchstat -col /rt fh.txt
//
// (one round per process, so the configurations alternate instead of
// each running its rounds back to back while the machine's load drifts).
// ns/op is the whole job, runsc's start included; work-s is the
// workload alone, timed inside the job.
func BenchmarkRunscFileHeavy(b *testing.B) {
	goroot, err := exec.Command("go", "env", "GOROOT").Output()
	if err != nil {
		b.Fatalf("go env GOROOT: %v", err)
	}
	bin := strings.TrimSpace(string(goroot)) + "/bin"
	e := newEnv(b, func(c *Config) { c.Path = bin + ":" + DefaultPath })
	if _, ok := e.m.Available(ClassRunsc); !ok {
		b.Fatal("runsc is unavailable")
	}
	for _, w := range fileHeavyWorkloads() {
		src := e.source(b, w.files)
		for _, rt := range fileHeavyRuntimes {
			b.Run("work="+w.name+"/rt="+rt.name, func(b *testing.B) {
				if rt.class == ClassRunsc {
					r := e.m.runtimes[ClassRunsc]
					r.fsFlags, r.batchFlags = rt.flags, rt.batch
					defer func() { r.fsFlags, r.batchFlags = runscFSFlags, runscBatchFlags }()
				}
				var work time.Duration
				n := 0
				for b.Loop() {
					work += runFileHeavy(b, e, rt.class, src, w)
					n++
				}
				b.ReportMetric(work.Seconds()/float64(n), "work-s")
			})
		}
	}
}

// fileHeavyRuntimes are the configurations compared: runc as the
// baseline, runsc as the executor starts a batch job, and runsc with one
// option changed each. root:self is not among them: runsc
// applies no root overlay to a read-only root whatever the medium
// (runsc/container's initGoferConfs), so root:memory stands for both.
var fileHeavyRuntimes = []struct {
	name         string
	class        Class
	flags, batch []string
}{
	{"runc", ClassRunc, nil, nil},
	// runsc-mounts-shared is how the executor starts runsc;
	// runsc-mounts-exclusive is runscBatchFlags' candidate.
	{"runsc-mounts-shared", ClassRunsc, runscFSFlags, runscBatchFlags},
	{"runsc-overlay-root-memory", ClassRunsc, []string{"--overlay2=root:memory"}, nil},
	{"runsc-nodirectfs", ClassRunsc, []string{"--overlay2=none", "--directfs=false"}, nil},
	{"runsc-mounts-exclusive", ClassRunsc, runscFSFlags, []string{"--file-access-mounts=exclusive"}},
}

type fileHeavyWorkload struct {
	name   string
	files  map[string]string
	script string
	env    map[string]string
	// want is a line the job prints only when the work was really done.
	want *regexp.Regexp
}

var workNS = regexp.MustCompile(`(?m)^work-ns=(\d+)$`)

// runFileHeavy runs w once in a fresh sandbox and returns the time the
// workload itself took inside it.
func runFileHeavy(b *testing.B, e *env, c Class, src string, w fileHeavyWorkload) time.Duration {
	b.Helper()
	var out, errb syncBuffer
	lim := Limits{CPUMillis: 2000, MemoryBytes: 2 << 30, Pids: 1024, DiskBytes: 1 << 30, Deadline: 10 * time.Minute}
	id := fmt.Sprintf("fh-%d", testSeq.Add(1))
	script := "set -e\ns=$(date +%s%N)\n" + w.script + "\ne=$(date +%s%N)\necho work-ns=$((e-s))\n"
	sb, err := e.m.Create(context.Background(), Spec{ID: id, Class: c, Source: src, Command: []string{"/bin/sh", "-c", script},
		Env: w.env, Limits: lim, Stdout: &out, Stderr: &errb})
	if err != nil {
		b.Fatal(err)
	}
	res, err := sb.Run(context.Background())
	if derr := sb.Destroy(); derr != nil {
		b.Fatal(derr)
	}
	if err != nil || res.Reason != ReasonExited || res.ExitCode != 0 || !w.want.MatchString(out.String()) {
		b.Fatalf("%s %s: %v %+v\nstdout: %s\nstderr: %s", c, w.name, err, res, trunc(out.String()), trunc(errb.String()))
	}
	m := workNS.FindStringSubmatch(out.String())
	if m == nil {
		b.Fatalf("no work-ns line: %s", trunc(out.String()))
	}
	ns, _ := strconv.ParseInt(m[1], 10, 64)
	return time.Duration(ns)
}

// fileHeavyWorkloads are deterministic stand-ins for the builds:
// a C build of many small files (libuv, zlib), a Go build with a cold
// build cache (fsnotify's suite), and a tree of many small files
// unpacked, walked and searched (a test suite's fixtures, a node_modules).
func fileHeavyWorkloads() []fileHeavyWorkload {
	return []fileHeavyWorkload{
		{name: "cbuild", files: cBuildTree(48), script: "make -s -j2", want: regexp.MustCompile(`(?m)^sum=\d+$`)},
		{
			name:   "gobuild",
			files:  goBuildTree(),
			script: "go build -o /tmp/app . && /tmp/app",
			env: map[string]string{"HOME": "/tmp", "GOCACHE": "/tmp/gocache", "GOPATH": "/tmp/gopath", "GOTOOLCHAIN": "local",
				"GOPROXY": "off", "GOFLAGS": "-mod=mod", "CGO_ENABLED": "0"},
			want: regexp.MustCompile(`(?m)^words=\d+$`),
		},
		{
			name:  "smallfiles",
			files: map[string]string{"tree.tar": smallFilesTar(6000)},
			script: `mkdir /tmp/t && tar -xf tree.tar -C /tmp/t
echo files=$(find /tmp/t -type f | wc -l)
ls -lR /tmp/t >/dev/null
echo needles=$(grep -rl needle /tmp/t | wc -l)`,
			want: regexp.MustCompile(`(?m)^needles=600$`),
		},
	}
}

// cBuildTree is n C files, each including a few system headers, and a
// Makefile that compiles them into build/ under /work and links them.
func cBuildTree(n int) map[string]string {
	files := map[string]string{
		"src/common.h": "#include <stdio.h>\n#include <stdlib.h>\n#include <string.h>\n#include <stdint.h>\n#include <errno.h>\n",
	}
	var decls, calls strings.Builder
	for i := range n {
		files[fmt.Sprintf("src/f%03d.c", i)] = fmt.Sprintf(`#include "common.h"
static uint64_t mix%[1]d(uint64_t x) { for (int i = 0; i < %[1]d %% 7 + 3; i++) x = x * 6364136223846793005ULL + %[1]d; return x; }
uint64_t f%[1]d(uint64_t x) { char buf[32]; snprintf(buf, sizeof buf, "%%llu", (unsigned long long)x); return mix%[1]d(x ^ strlen(buf)); }
`, i)
		fmt.Fprintf(&decls, "uint64_t f%d(uint64_t);\n", i)
		fmt.Fprintf(&calls, "\ts += f%d(s) %% 1000;\n", i)
	}
	files["src/main.c"] = fmt.Sprintf("#include \"common.h\"\n%sint main(void) {\n\tuint64_t s = 1;\n%s\tprintf(\"sum=%%llu\\n\", (unsigned long long)s);\n\treturn 0;\n}\n", decls.String(), calls.String())
	files["Makefile"] = `SRCS := $(wildcard src/*.c)
OBJS := $(patsubst src/%.c,build/%.o,$(SRCS))
all: build/prog
	./build/prog
build/prog: $(OBJS)
	cc -o $@ $(OBJS)
build/%.o: src/%.c src/common.h | build
	cc -O0 -c -o $@ $<
build:
	mkdir -p build
`
	return files
}

// goBuildTree is a small module of three packages over a part of the
// standard library that `go build` compiles from nothing with an empty
// GOCACHE.
func goBuildTree() map[string]string {
	return map[string]string{
		"go.mod": "module example.com/fileheavy\n\ngo 1.22\n",
		"main.go": `package main

import (
	"fmt"
	"os"

	"example.com/fileheavy/count"
)

func main() {
	fmt.Printf("words=%d\n", count.Words(os.Args[0]+" a b c"))
}
`,
		"count/count.go": `package count

import (
	"sort"
	"strings"

	"example.com/fileheavy/norm"
)

// Words counts distinct words.
func Words(s string) int {
	ws := strings.Fields(norm.Lower(s))
	sort.Strings(ws)
	n := 0
	for i, w := range ws {
		if i == 0 || w != ws[i-1] {
			n++
		}
	}
	return n
}
`,
		"norm/norm.go": `package norm

import (
	"strconv"
	"strings"
	"unicode"
)

// Lower lower-cases s and spells out digits.
func Lower(s string) string {
	return strings.Map(func(r rune) rune {
		if unicode.IsDigit(r) {
			return []rune(strconv.Itoa(int(r - '0')))[0]
		}
		return unicode.ToLower(r)
	}, s)
}
`,
	}
}

// smallFilesTar is a tar of n small files in n/100 directories; every
// tenth holds the word "needle".
func smallFilesTar(n int) string {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	r := rand.New(rand.NewPCG(27, 6))
	const letters = "abcdefghijklmnopqrstuvwxyz \n"
	for i := range n {
		size := 200 + r.IntN(3000)
		body := make([]byte, size)
		for j := range body {
			body[j] = letters[r.IntN(len(letters))]
		}
		if i%10 == 0 {
			copy(body[size/2:], "needle")
		}
		hdr := &tar.Header{Name: fmt.Sprintf("d%02d/sub/f%05d.txt", i/100, i), Mode: 0o644, Size: int64(size), Typeflag: tar.TypeReg,
			ModTime: time.Unix(1700000000, 0)}
		if err := tw.WriteHeader(hdr); err != nil {
			panic(err)
		}
		tw.Write(body)
	}
	tw.Close()
	return buf.String()
}
