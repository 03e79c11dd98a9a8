package sandbox

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlockhq/airlock/pkg/runspec"
)

// Who the job runs as (Spec.User). Its uid and gid inside are mapped to
// Config.UIDBase plus them on the host, like every id of the sandbox. The
// job's processes run as that user with no capabilities, under runc and
// runsc alike; what it owns is its home, /out and everything in /work.
//
// The retained source is owned by the sandbox's root (UIDBase) and shared
// by every job on its commit, so for any other user /work's lower layer is
// an idmapped mount of it (mount_setattr MOUNT_ATTR_IDMAP) on which the
// source's owner reads as the job's user: nothing is copied or chowned, a
// file the job changes is copied up owned by it, and the upper layer, which
// the export reads, holds only what the job wrote.

// HostIDs are the uid and gid the job runs as, as the host sees them: the
// owner of what the executor writes for the job.
func (s *Sandbox) HostIDs() (uid, gid int) { return s.m.hostIDs(s.spec.User) }

// hostIDs are u's uid and gid as the host sees them.
func (m *Manager) hostIDs(u runspec.User) (uid, gid int) {
	return int(m.cfg.UIDBase + u.UID), int(m.cfg.UIDBase + u.GID)
}

// The base of the synthesized /etc/passwd and /etc/group (template.go),
// which a job that runs as another user gets with its user added.
const (
	basePasswd = "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
	baseGroup  = "root:x:0:\nnogroup:x:65534:\n"
)

// userEtc is the /etc/passwd and /etc/group a job running as u sees:
// the template's with u and its group added (u being neither root nor
// nobody). "" means the template's serve as they are.
func userEtc(u runspec.User) (passwd, group string) {
	if u.UID != 0 {
		passwd = basePasswd + fmt.Sprintf("%s:x:%d:%d::%s:/bin/sh\n", u.Name(), u.UID, u.GID, u.Home())
	}
	if u.GID != 0 {
		group = baseGroup + fmt.Sprintf("%s:x:%d:\n", u.GroupName(), u.GID)
	}
	return passwd, group
}

// writeUserFiles writes s's /etc/passwd and /etc/group beside its bundle
// when the template's do not name its user, and returns them as
// destination to host path.
func (s *Sandbox) writeUserFiles() (map[string]string, error) {
	passwd, group := userEtc(s.spec.User)
	out := map[string]string{}
	for _, f := range []struct{ dst, name, content string }{
		{"/etc/passwd", "passwd", passwd}, {"/etc/group", "group", group},
	} {
		if f.content == "" {
			continue
		}
		p := filepath.Join(s.dir, f.name)
		if err := os.WriteFile(p, []byte(f.content), 0o644); err != nil {
			return nil, err
		}
		out[f.dst] = p
	}
	return out, nil
}

// makeHomes makes, for a user other than root, the directory bound
// read-only at /home: the sandbox's root's, holding only the empty mount
// point of the user's home. "" for root, whose home is /root.
func (s *Sandbox) makeHomes() (string, error) {
	u := s.spec.User
	if u.IsRoot() {
		return "", nil
	}
	homes := filepath.Join(s.dir, "homes")
	root := int(s.m.cfg.UIDBase)
	for _, d := range []string{homes, filepath.Join(homes, u.Name())} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", err
		}
		if err := os.Chown(d, root, root); err != nil {
			return "", err
		}
	}
	return homes, nil
}

// userEnv is what the environment says of u.
func userEnv(u runspec.User) map[string]string {
	return map[string]string{"HOME": u.Home(), "USER": u.Name(), "LOGNAME": u.Name()}
}

// workLower is the lower layer of s's /work: the source itself for root,
// else an idmapped mount of it at s.dir/source on which the source's
// owner, the sandbox's root, reads as the job's user.
func (s *Sandbox) workLower() (string, error) {
	u := s.spec.User
	if u == runspec.Root {
		return s.spec.Source, nil
	}
	target := filepath.Join(s.dir, "source")
	if err := os.Mkdir(target, 0o700); err != nil {
		return "", err
	}
	if err := s.m.idmaps.bind(s.m.cfg.UIDBase, u, s.spec.Source, target); err != nil {
		return "", err
	}
	return target, nil
}

// idmappedBind binds src at dst (a directory) through the user namespace
// ns's id mapping.
func idmappedBind(src, dst string, ns *os.File) error {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if err != nil {
		return fmt.Errorf("open_tree %s: %w", src, err)
	}
	defer unix.Close(fd)
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV | unix.MOUNT_ATTR_RDONLY, Userns_fd: uint64(ns.Fd())}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		return fmt.Errorf("mount_setattr: %w", err)
	}
	if err := unix.MoveMount(fd, "", unix.AT_FDCWD, dst, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}

// maxIdmaps bounds the user namespaces an idmapCache keeps: a tenant may
// ask for any uid and gid, and each pair would otherwise keep a file and
// a namespace of the host's for as long as the executor runs.
const maxIdmaps = 32

// idmapCache holds a user namespace per id mapping, made once and kept
// (up to maxIdmaps): mount_setattr needs one for each idmapped mount, and
// the mount keeps its own reference, so a namespace may be dropped as
// soon as no bind is using it.
type idmapCache struct {
	mu  sync.Mutex
	nss map[[3]uint32]*os.File
}

// bind binds src at dst (a directory) through a user namespace mapping
// the host uid and gid base (as ids inside it) to base+u.UID and
// base+u.GID (on the host). The lock is held throughout, so a namespace
// is never closed while a bind uses it.
func (c *idmapCache) bind(base uint32, u runspec.User, src, dst string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	key := [3]uint32{base, u.UID, u.GID}
	ns, ok := c.nss[key]
	if !ok {
		var err error
		if ns, err = newIDMapNS(base, base+u.UID, base+u.GID); err != nil {
			return fmt.Errorf("user namespace for %s: %w", u, err)
		}
		if c.nss == nil {
			c.nss = map[[3]uint32]*os.File{}
		}
		for k, f := range c.nss {
			if len(c.nss) < maxIdmaps {
				break
			}
			f.Close()
			delete(c.nss, k)
		}
		c.nss[key] = ns
	}
	if err := idmappedBind(src, dst, ns); err != nil {
		return fmt.Errorf("idmapped mount of the source for %s (needs Linux 5.19 or later and a file system that supports idmapped mounts): %w", u, err)
	}
	return nil
}

// close releases every namespace.
func (c *idmapCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, f := range c.nss {
		f.Close()
		delete(c.nss, k)
	}
}

// newIDMapNS makes a user namespace in which id from is host uid toUID and
// host gid toGID. A multi-threaded process cannot unshare one, so a child
// is started in it (waiting on a pipe, with no other way in or out), its
// namespace opened, and the child ended.
func newIDMapNS(from, toUID, toGID uint32) (*os.File, error) {
	cat, err := exec.LookPath("cat")
	if err != nil {
		for _, p := range []string{"/usr/bin/cat", "/bin/cat"} {
			if _, serr := os.Stat(p); serr == nil {
				cat, err = p, nil
				break
			}
		}
		if err != nil {
			return nil, err
		}
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	cmd := exec.Command(cat)
	cmd.Stdin = r
	cmd.Env = []string{}
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: int(from), HostID: int(toUID), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: int(from), HostID: int(toGID), Size: 1}},
		Pdeathsig:   syscall.SIGKILL,
	}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("start a process in a new user namespace: %w", err)
	}
	ns, nsErr := os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
	w.Close() // cat ends with its input
	waitErr := cmd.Wait()
	if nsErr != nil {
		return nil, nsErr
	}
	if waitErr != nil {
		ns.Close()
		return nil, fmt.Errorf("the process in the new user namespace: %w", waitErr)
	}
	return ns, nil
}
