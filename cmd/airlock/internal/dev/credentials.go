package dev

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/airlockhq/airlock/pkg/egress"
)

// devCredential is one --credential-broker: a brokered credential of the
// dev tenant, injected as "Authorization: Bearer VALUE" on its hosts.
type devCredential struct {
	name     string
	hosts    []string
	file     string
	approval bool
}

// parseCredentialBrokers reads --credential-broker NAME:HOST[,HOST...]:FILE
// flags and marks those --credential-approval names; errors name the flag.
func parseCredentialBrokers(brokers, approvals []string) ([]devCredential, error) {
	var out []devCredential
	for _, b := range brokers {
		parts := strings.SplitN(b, ":", 3)
		if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
			return nil, fmt.Errorf("--credential-broker %q: want NAME:HOST[,HOST...]:FILE", b)
		}
		c := devCredential{name: parts[0]}
		if slices.ContainsFunc(out, func(o devCredential) bool { return o.name == c.name }) {
			return nil, fmt.Errorf("--credential-broker %s: named twice", c.name)
		}
		for _, h := range strings.Split(parts[1], ",") {
			host, err := egress.NormalizeName(h)
			if err != nil {
				return nil, fmt.Errorf("--credential-broker %s: %v", c.name, err)
			}
			c.hosts = append(c.hosts, host)
		}
		abs, err := filepath.Abs(parts[2])
		if err != nil {
			return nil, err
		}
		if st, err := os.Stat(abs); err != nil || !st.Mode().IsRegular() {
			return nil, fmt.Errorf("--credential-broker %s: %s is not a readable regular file", c.name, abs)
		}
		c.file = abs
		out = append(out, c)
	}
	for _, a := range approvals {
		i := slices.IndexFunc(out, func(c devCredential) bool { return c.name == a })
		if i < 0 {
			return nil, fmt.Errorf("--credential-approval %s: no --credential-broker names it", a)
		}
		out[i].approval = true
	}
	return out, nil
}

// credentialPolicy is the dev tenant's credentials block for creds, and
// its egress domains with every credential host added that they do not
// already allow (else no job could reach it, and the authority refuses
// the policy).
func credentialPolicy(creds []devCredential, domains []string) (map[string]any, []string) {
	block := map[string]any{}
	out := slices.Clone(domains)
	for _, c := range creds {
		entry := map[string]any{"hosts": c.hosts, "source": map[string]any{"file": c.file}}
		if c.approval {
			entry["approval"] = "required"
		}
		block[c.name] = entry
		for _, h := range c.hosts {
			var ceiling egress.Policy
			for _, d := range out {
				ceiling.Names = append(ceiling.Names, egress.Name{Name: d})
			}
			if !ceiling.AllowsName(h) {
				out = append(out, h)
			}
		}
	}
	return block, out
}
