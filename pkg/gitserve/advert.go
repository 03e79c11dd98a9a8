package gitserve

import (
	"bytes"
	"crypto/sha256"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sync"
)

// A repository's fetch ref advertisement (GET info/refs?service=
// git-upload-pack in git's original protocol, what Airlock's authority
// reads to resolve a branch at submission) is a function of its refs:
// `git http-backend` and `git upload-pack` run only to print them. The
// server keeps the last advertisement of each repository with the state of
// the refs it was made from — HEAD, packed-refs and every loose ref, read
// byte for byte — and answers from it while that state is unchanged: a
// ref listing is then a few file reads, not two git processes. Any change
// of any ref is a different state and a fresh listing, so a branch always
// resolves to its commit at the time of the request. A state is kept only
// if it read the same before and after the listing was made. Requests in
// git's protocol v2 (a Git-Protocol header), and receive-pack listings, go
// to git as before.

// maxCachedAdvert bounds what is kept per repository.
const maxCachedAdvert = 4 << 20

type advertCache struct {
	mu     sync.Mutex
	state  [sha256.Size]byte
	header http.Header
	body   []byte
	ok     bool
}

// refState is a digest of everything in rp that names a commit: HEAD,
// packed-refs and the refs directory, names and contents. ok is false when
// it could not be read in full.
func refState(dir string) (sum [sha256.Size]byte, ok bool) {
	h := sha256.New()
	for _, name := range []string{"HEAD", "packed-refs"} {
		data, err := os.ReadFile(filepath.Join(dir, name))
		switch {
		case err == nil:
		case os.IsNotExist(err):
			data = []byte("\x00absent")
		default:
			return sum, false
		}
		h.Write([]byte(name))
		h.Write([]byte{0})
		h.Write(data)
		h.Write([]byte{0})
	}
	refs := filepath.Join(dir, "refs")
	err := filepath.WalkDir(refs, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		h.Write([]byte(p[len(refs):]))
		h.Write([]byte{0})
		h.Write(data)
		h.Write([]byte{0})
		return nil
	})
	if err != nil {
		return sum, false
	}
	copy(sum[:], h.Sum(nil))
	return sum, true
}

// cacheable reports whether r's answer may come from (and go to) the cache.
func cacheable(r *http.Request, service string) bool {
	return r.Method == http.MethodGet && service == "git-upload-pack" && r.Header.Get("Git-Protocol") == ""
}

// serveAdvert answers r from rp's cached advertisement if its refs are as
// they were; else it runs next, keeping the answer when the refs did not
// move meanwhile.
func (s *Server) serveAdvert(w http.ResponseWriter, r *http.Request, rp *repo, next http.Handler) {
	c := &rp.advert
	before, ok := refState(rp.dir)
	if ok {
		c.mu.Lock()
		hit := c.ok && c.state == before
		header, body := c.header, c.body
		c.mu.Unlock()
		if hit {
			for k, v := range header {
				w.Header()[k] = v
			}
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(body)
			return
		}
	}
	rec := &recorder{w: w, header: http.Header{}}
	next.ServeHTTP(rec, r)
	if rec.passthrough {
		return
	}
	rec.flush()
	after, ok2 := refState(rp.dir)
	if ok && ok2 && before == after && rec.status == http.StatusOK &&
		rec.header.Get("Content-Type") == "application/x-git-upload-pack-advertisement" {
		c.mu.Lock()
		c.state, c.header, c.body, c.ok = after, rec.header, rec.body.Bytes(), true
		c.mu.Unlock()
	}
}

// recorder holds a listing's answer for the cache, and passes it on
// unkept once it is over maxCachedAdvert.
type recorder struct {
	w           http.ResponseWriter
	header      http.Header
	status      int
	body        bytes.Buffer
	passthrough bool
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	if r.passthrough {
		return r.w.Write(p)
	}
	if r.body.Len()+len(p) > maxCachedAdvert {
		r.flush()
		r.passthrough = true
		r.body = bytes.Buffer{}
		return r.w.Write(p)
	}
	return r.body.Write(p)
}

// flush sends what r holds.
func (r *recorder) flush() {
	for k, v := range r.header {
		r.w.Header()[k] = v
	}
	if r.status == 0 {
		r.status = http.StatusOK
	}
	r.w.WriteHeader(r.status)
	_, _ = r.w.Write(r.body.Bytes())
}
