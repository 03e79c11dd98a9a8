package dev

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlockhq/airlock/cmd/airlock/internal/cmdutil"
)

// TestDevImagePushBadInput: each kind of bad input to dev image push is
// refused before anything is made or pushed, as a usage error naming the
// flag and saying what to give instead.
func TestDevImagePushBadInput(t *testing.T) {
	tmp := t.TempDir()
	tarFile := filepath.Join(tmp, "rootfs.tar")
	if err := os.WriteFile(tarFile, []byte("not checked before the name and the stack"), 0o600); err != nil {
		t.Fatal(err)
	}
	noStack := filepath.Join(tmp, "no-stack")
	for _, tc := range []struct {
		name       string
		rootfs     string
		ref        string
		wantSubstr []string
	}{
		{"missing tar", filepath.Join(tmp, "gone.tar"), "dev/python:3", []string{"--rootfs", "gone.tar", "no such file"}},
		{"a directory for the tar", tmp, "dev/python:3", []string{"--rootfs", "not a file"}},
		{"a registry host", tarFile, "127.0.0.1:5000/dev/python:3", []string{"--name", "registry host (127.0.0.1:5000)"}},
		{"a registry host name", tarFile, "registry.example/dev/python:3", []string{"--name", "registry host (registry.example)"}},
		{"no tag", tarFile, "dev/python", []string{"--name", "no tag"}},
		{"a digest", tarFile, "dev/python@sha256:" + strings.Repeat("0", 64), []string{"--name", "digest"}},
		{"outside dev/", tarFile, "python:3", []string{"--name", "below dev/", "dev/python:3"}},
		{"a bad tag", tarFile, "dev/python:3!", []string{"--name"}},
		{"a stack without a registry", tarFile, "dev/python:3", []string{"--dir", "has no registry", "airlock dev up --dir " + noStack + " --registry"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			cmd := newDevImagePush(&cmdutil.Globals{Output: "text", Stdout: &stdout, Stderr: &stderr})
			cmd.SetArgs([]string{"--dir", noStack, "--rootfs", tc.rootfs, "--name", tc.ref})
			cmd.SetOut(&stderr)
			cmd.SetErr(&stderr)
			cmd.SilenceUsage, cmd.SilenceErrors = true, true
			err := cmd.Execute()
			if err == nil {
				t.Fatalf("push succeeded; stdout %q", stdout.String())
			}
			var usage cmdutil.UsageError
			if !errors.As(err, &usage) {
				t.Errorf("error %T %v is not a usage error", err, err)
			}
			for _, want := range tc.wantSubstr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
			if stdout.Len() != 0 {
				t.Errorf("stdout %q, want nothing", stdout.String())
			}
		})
	}
}
