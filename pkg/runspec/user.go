package runspec

import (
	"fmt"
	"strconv"
	"strings"
)

// Who a job runs as. Every sandbox maps ids 0 to IDRange-1 of its user
// namespace to a fixed host range (the executor's sandbox.uid_base up), so
// a job's uid and gid must lie in that range; the authority refuses any
// other at submission and the executor every grant, rather than letting
// the runtime fail at start. The top two ids are kept out: 65534 is the
// overflow id (nobody, nogroup) every unmapped host file shows as, and
// 65535 is (uid_t)-1 to 16-bit interfaces.

// IDRange is how many uids and gids every sandbox maps.
const IDRange = 65536

// MaxUserID is the largest uid or gid a job may run as.
const MaxUserID = IDRange - 3

// The named users of the synthesized /etc/passwd.
const (
	// AgentUID is the non-root user "agent", whose home is /home/agent;
	// its group "agent" has the same number.
	AgentUID  = 1000
	AgentName = "agent"
)

// User is the uid and gid a job's processes run as inside the sandbox.
type User struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// Root is uid 0, gid 0.
var Root = User{}

// Agent is the non-root user agent (1000:1000).
var Agent = User{UID: AgentUID, GID: AgentUID}

// IsRoot reports whether u's uid is 0.
func (u User) IsRoot() bool { return u.UID == 0 }

// String is u as ParseUser reads it: "UID:GID".
func (u User) String() string { return fmt.Sprintf("%d:%d", u.UID, u.GID) }

// Name is the user's name in the sandbox's /etc/passwd: root, agent, or
// "user" and the uid.
func (u User) Name() string {
	switch u.UID {
	case 0:
		return "root"
	case AgentUID:
		return AgentName
	}
	return "user" + strconv.FormatUint(uint64(u.UID), 10)
}

// GroupName is the name of the user's group in the sandbox's /etc/group:
// root, agent, or "group" and the gid.
func (u User) GroupName() string {
	switch u.GID {
	case 0:
		return "root"
	case AgentUID:
		return AgentName
	}
	return "group" + strconv.FormatUint(uint64(u.GID), 10)
}

// Home is the user's home directory: /root for root, /home/NAME for any
// other user. It exists and is owned by the user.
func (u User) Home() string {
	if u.IsRoot() {
		return "/root"
	}
	return "/home/" + u.Name()
}

// CheckUser checks that u's ids are ones every sandbox maps (0 to
// MaxUserID).
func CheckUser(u User) error {
	if u.UID > MaxUserID {
		return fmt.Errorf("uid %d: must be 0 to %d (the ids every sandbox's user namespace maps, less nobody and -1)", u.UID, MaxUserID)
	}
	if u.GID > MaxUserID {
		return fmt.Errorf("gid %d: must be 0 to %d (the ids every sandbox's user namespace maps, less nogroup and -1)", u.GID, MaxUserID)
	}
	return nil
}

// ParseUser reads "root", "agent", "UID" or "UID:GID" (decimal); a uid
// alone has the gid of the same number. The ids are checked (CheckUser).
func ParseUser(s string) (User, error) {
	switch s {
	case "root":
		return Root, nil
	case AgentName:
		return Agent, nil
	}
	us, gs, hasGID := strings.Cut(s, ":")
	uid, err := parseID(us)
	if err != nil {
		return User{}, fmt.Errorf("%q: want root, agent, UID or UID:GID (decimal ids): uid %v", s, err)
	}
	gid := uid
	if hasGID {
		if gid, err = parseID(gs); err != nil {
			return User{}, fmt.Errorf("%q: want root, agent, UID or UID:GID (decimal ids): gid %v", s, err)
		}
	}
	u := User{UID: uid, GID: gid}
	if err := CheckUser(u); err != nil {
		return User{}, err
	}
	return u, nil
}

func parseID(s string) (uint32, error) {
	if s == "" || len(s) > 10 || strings.TrimLeft(s, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a decimal number", s)
	}
	n, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	return uint32(n), nil
}
