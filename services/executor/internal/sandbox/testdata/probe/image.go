package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// imageProbe prints what a job sees of its root filesystem, one line per
// question, for the image tests (the probe is an image's only program):
//
//	cat PATH...  "PATH: CONTENT" (newlines as \n), or "PATH: absent"
//	ls DIR...    "DIR: NAME NAME...", sorted, or "DIR: absent"
//	env          the environment, one variable a line
//	write P T    writes T to the file P
//	writeall     tries to change everything in the root outside the job's
//	             own mounts, printing "CHANGED HOW PATH" for each change
//	             that worked, then "done"
//	idle         prints "running" and waits to be killed
func imageProbe(cmd string, args []string) {
	switch cmd {
	case "cat":
		for _, p := range args {
			b, err := os.ReadFile(p)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				fmt.Printf("%s: absent\n", p)
			case err != nil:
				fmt.Printf("%s: error %v\n", p, err)
			default:
				fmt.Printf("%s: %s\n", p, strings.ReplaceAll(string(b), "\n", `\n`))
			}
		}
	case "ls":
		for _, d := range args {
			ents, err := os.ReadDir(d)
			switch {
			case errors.Is(err, fs.ErrNotExist):
				fmt.Printf("%s: absent\n", d)
			case err != nil:
				fmt.Printf("%s: error %v\n", d, err)
			default:
				var names []string
				for _, e := range ents {
					names = append(names, e.Name())
				}
				sort.Strings(names)
				fmt.Printf("%s: %s\n", d, strings.Join(names, " "))
			}
		}
	case "env":
		for _, kv := range os.Environ() {
			fmt.Println(kv)
		}
	case "write":
		if err := os.WriteFile(args[0], []byte(args[1]), 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	case "writeall":
		writeAll()
	case "idle":
		fmt.Println("running")
		// Not select{}: with no timer pending, Go's runtime calls that a
		// deadlock and exits.
		for {
			time.Sleep(time.Hour)
		}
	}
}

// ownMounts are the job's own, writable or kernel, mounts: not the root's.
var ownMounts = map[string]bool{"/proc": true, "/sys": true, "/dev": true, "/work": true, "/tmp": true, "/out": true, "/root": true, "/home": true}

func writeAll() {
	changed := func(how, p string, err error) {
		if err == nil {
			fmt.Println("CHANGED", how, p)
		}
	}
	_ = filepath.WalkDir("/", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if ownMounts[p] {
			return filepath.SkipDir
		}
		if d.IsDir() {
			changed("create", p, os.WriteFile(filepath.Join(p, ".airlock-probe"), []byte("x"), 0o644))
			changed("mkdir", p, os.Mkdir(filepath.Join(p, ".airlock-probe-dir"), 0o755))
			changed("chmod", p, os.Chmod(p, 0o777))
			return nil
		}
		if d.Type().IsRegular() {
			f, err := os.OpenFile(p, os.O_WRONLY|os.O_APPEND, 0)
			if err == nil {
				_, err = f.Write([]byte("x"))
				f.Close()
			}
			changed("append", p, err)
			changed("chmod", p, os.Chmod(p, 0o777))
		}
		changed("rename", p, os.Rename(p, p+".moved"))
		changed("remove", p, os.Remove(p))
		return nil
	})
	fmt.Println("done")
}
