package runspec_test

import (
	"strings"
	"testing"

	"github.com/airlockhq/airlock/pkg/runspec"
)

// ParseUser takes the names and numbers a tenant policy and --user give,
// and refuses any id no sandbox maps (65534 and 65535 included) naming
// which one.
func TestParseUser(t *testing.T) {
	for in, want := range map[string]runspec.User{
		"root": runspec.Root, "agent": runspec.Agent, "0": runspec.Root, "1000": runspec.Agent,
		"1000:1000": runspec.Agent, "2000:3000": {UID: 2000, GID: 3000}, "0:5": {UID: 0, GID: 5},
		"65533:65533": {UID: 65533, GID: 65533},
	} {
		got, err := runspec.ParseUser(in)
		if err != nil || got != want {
			t.Errorf("ParseUser(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for in, text := range map[string]string{
		"65534": "uid 65534: must be 0 to 65533", "1:65535": "gid 65535: must be 0 to 65533",
		"4294967295": "uid 4294967295", "4294967296": "out of range", "-1": "not a decimal number",
		"+5": "not a decimal number", "": "not a decimal number", "1000:": "gid", "agent:1": "uid",
		"nobody": "want root, agent, UID or UID:GID", "1:2:3": "gid", " 1": "not a decimal number",
	} {
		if _, err := runspec.ParseUser(in); err == nil || !strings.Contains(err.Error(), text) {
			t.Errorf("ParseUser(%q): %v; want an error naming %q", in, err, text)
		}
	}
}

// Each user has a name, a group name and a home in the sandbox's /etc.
func TestUserNames(t *testing.T) {
	for _, tc := range []struct {
		u                 runspec.User
		name, group, home string
	}{
		{runspec.Root, "root", "root", "/root"},
		{runspec.Agent, "agent", "agent", "/home/agent"},
		{runspec.User{UID: 2000, GID: 0}, "user2000", "root", "/home/user2000"},
		{runspec.User{UID: 0, GID: 3000}, "root", "group3000", "/root"},
	} {
		if tc.u.Name() != tc.name || tc.u.GroupName() != tc.group || tc.u.Home() != tc.home {
			t.Errorf("%v: %s %s %s; want %s %s %s", tc.u, tc.u.Name(), tc.u.GroupName(), tc.u.Home(), tc.name, tc.group, tc.home)
		}
	}
}

// A cache lies below /tmp or the job user's own home: /root is root's
// alone, /home/agent agent's; any other home is the shared template's.
func TestCheckCacheUser(t *testing.T) {
	other := runspec.User{UID: 2000, GID: 2000}
	for _, c := range []struct {
		p    string
		u    runspec.User
		want string // "" for allowed, else a part of the error
	}{
		{"/root/.cache/go-build", runspec.Agent, "/home/agent"},
		{"/home/agent/.cache", runspec.Root, "/root"},
		{"/home/agent/.cache", other, other.Home()},
		{"/home/agentx/.cache", runspec.Agent, "/home/agent"},
		{"/root/.cache/go-build", runspec.Root, ""},
		{"/tmp/c", runspec.Root, ""},
		{"/home/agent/.cache", runspec.Agent, ""},
		{"/tmp/c", runspec.Agent, ""},
		{other.Home() + "/.npm", other, ""},
	} {
		err := runspec.CheckCacheUser(c.p, c.u)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("uid %d, %s: %v, want %q", c.u.UID, c.p, err, c.want)
		}
	}
	if err := runspec.CheckCachePath("/home/agent/.npm"); err != nil {
		t.Errorf("CheckCachePath below /home: %v", err)
	}
}
