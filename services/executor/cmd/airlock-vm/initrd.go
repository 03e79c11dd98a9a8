package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/digest"
	"github.com/airlockhq/airlock/services/executor/internal/vm/initramfs"
	"github.com/airlockhq/airlock/services/executor/internal/vm/kernel"
)

// fileDigest is the sha256 digest of a file's content.
func fileDigest(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return digest.Of(data), nil
}

// cachedInitramfs returns the initramfs for the agent and kernel, built
// once into root/.initramfs and kept there under a name made of both (a new agent
// build or kernel makes a new one; older ones are left for an operator
// to remove with the state root). It is uncompressed: the kernel then
// unpacks it without decompressing, which is slow under TCG.
func cachedInitramfs(root, agent string, k kernel.Kernel) (string, error) {
	sum, err := fileDigest(agent)
	if err != nil {
		return "", fmt.Errorf("agent: %w", err)
	}
	key := sha256.Sum256([]byte(sum + "\x00" + k.Package + "\x00" + k.Version))
	// A name no container ID can have (IDs start with a letter or digit).
	dir := filepath.Join(root, ".initramfs")
	path := filepath.Join(dir, hex.EncodeToString(key[:12])+".cpio")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	f, err := atomicfile.Create(path, 0o644)
	if err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	if err := initramfs.Build(f.File, initramfs.Options{Agent: agent, Modules: k.ModulesDir}); err != nil {
		f.Abort()
		return "", err
	}
	if err := f.Commit(atomicfile.Fast); err != nil {
		return "", fmt.Errorf("initramfs: %w", err)
	}
	return path, nil
}
