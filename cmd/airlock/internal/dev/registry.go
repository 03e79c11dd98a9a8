package dev

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"gopkg.in/yaml.v3"

	"github.com/airlockhq/airlock/pkg/pki"
	"github.com/airlockhq/airlock/pkg/registryserver"
)

// devRegistryName is the dev stack's OCI registry (dev up --registry), the
// reference registry (bin/registry, built by make build) as a process of
// the stack: DIR/registry/config.yml, registry.log, registry.pid, and its
// storage in DIR/registry/data, kept across dev up runs.
const devRegistryName = "registry"

// devRegistryUser is the registry's one account. Its password is random,
// kept in devRegistryCredential(dir) as USERNAME:PASSWORD, the file the
// authority reads for the dev tenant's images.
const devRegistryUser = "dev"

// devRegistryRepoPrefix is the part of the registry the dev tenant's jobs
// may name: 127.0.0.1:PORT/dev/*.
const devRegistryRepoPrefix = "dev/"

func devRegistryCredential(dir string) string {
	return filepath.Join(dir, "authority", "credentials", "registry.cred")
}

// devRegistry is the registry as dev up sets it up.
type devRegistry struct {
	server *devService
	// images is the dev tenant's images policy, as the authority's config
	// names it.
	images map[string]any
}

// devRegistrySetup makes what the registry of a dev stack needs in dir: a
// credential (kept from an earlier dev up), its htpasswd, a host
// certificate from the dev CA for 127.0.0.1, and the config file.
func devRegistrySetup(dir, pkiDir, addr string) (devRegistry, error) {
	s := devPaths(dir, devRegistryName)
	s.Address = addr
	credFile, err := devToken(devRegistryCredential(dir), devRegistryUser+":")
	if err != nil {
		return devRegistry{}, err
	}
	user, password, err := readRegistryCredential(credFile)
	if err != nil {
		return devRegistry{}, err
	}
	if err := os.MkdirAll(s.DataDir, 0o700); err != nil {
		return devRegistry{}, err
	}
	htpasswd := filepath.Join(dir, devRegistryName, "htpasswd")
	if err := registryserver.WriteHtpasswd(htpasswd, map[string]string{user: password}); err != nil {
		return devRegistry{}, err
	}
	cert, key, err := devHostPair(dir, devRegistryName, pkiDir)
	if err != nil {
		return devRegistry{}, err
	}
	err = registryserver.WriteConfig(s.Config, registryserver.Config{
		Addr: addr, CertFile: cert, KeyFile: key, Htpasswd: htpasswd, Realm: "airlock-dev", StorageDir: s.DataDir,
	})
	if err != nil {
		return devRegistry{}, err
	}
	images := map[string]any{
		"allowed": []string{addr + "/" + devRegistryRepoPrefix + "*"},
		"registries": map[string]any{
			addr: map[string]any{"credential": credFile, "ca": pki.CAPath(pkiDir)},
		},
	}
	return devRegistry{server: &s, images: images}, nil
}

// readRegistryCredential reads a USERNAME:PASSWORD file. Errors name the
// file, never what it holds.
func readRegistryCredential(path string) (user, password string, err error) {
	user, password, err = registryserver.ReadCredential(path)
	if err != nil {
		return "", "", fmt.Errorf("%s: %w", path, err)
	}
	return user, password, nil
}

// devHostPair issues the dev CA's host certificate for loopback (127.0.0.1,
// ::1, localhost) to the stack's process name, as DIR/NAME/server.crt and
// server.key.
func devHostPair(dir, name, pkiDir string) (cert, key string, err error) {
	ca, err := pki.LoadCA(pkiDir)
	if err != nil {
		return "", "", err
	}
	kp, err := ca.IssueHost(pki.IssueOptions{DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}})
	if err != nil {
		return "", "", err
	}
	cert, key = filepath.Join(dir, name, "server.crt"), filepath.Join(dir, name, "server.key")
	return cert, key, pki.WriteHostPair(cert, key, kp)
}

// devRegistryStart starts the registry as a process of its own, in the
// minimal environment registryserver.Env gives it, and waits until it
// answers over TLS with the dev CA's certificate (401 without a
// credential).
func devRegistryStart(ctx context.Context, dir, bin string, s *devService, pkiDir string, r *reservation) error {
	pid, exited, err := startProcess(append([]string{bin}, registryserver.Args(s.Config)...), registryserver.Env(s.Config), s, r)
	if err != nil {
		return err
	}
	s.PID = pid
	if err := writePID(dir, devRegistryName, pid); err != nil {
		return err
	}
	return waitHTTPS(ctx, "the registry", "https://"+s.Address+"/v2/", s, pkiDir, exited)
}

// devRegistryAddress is the address of the running registry of the stack
// in dir, from its config file; an error says how to start one.
func devRegistryAddress(dir string) (string, error) {
	s := devPaths(dir, devRegistryName)
	data, err := os.ReadFile(s.Config)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("the stack in %s has no registry: start it with `airlock dev up --dir %s --registry`", dir, dir)
	}
	if err != nil {
		return "", err
	}
	var f struct {
		HTTP struct {
			Addr string `yaml:"addr"`
		} `yaml:"http"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil || f.HTTP.Addr == "" {
		return "", fmt.Errorf("%s: no http.addr (%v)", s.Config, err)
	}
	if _, ok := runningPID(dir, devRegistryName); !ok {
		return "", fmt.Errorf("the registry of the stack in %s is not running: start it with `airlock dev up --dir %s --registry`", dir, dir)
	}
	return f.HTTP.Addr, nil
}
