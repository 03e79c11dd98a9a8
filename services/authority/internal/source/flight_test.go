package source

import (
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/services/authority/internal/policy"
)

func pkt(s string) string { return fmt.Sprintf("%04x%s", len(s)+4, s) }

// A submission that starts while another's ref listing is in flight never
// gets that older answer: it waits for a listing sent after it asked, so a
// push that landed before it is seen (it got the pre-push commit before).
func TestListingIsNeverOlderThanItsCaller(t *testing.T) {
	A, B := strings.Repeat("a", 40), strings.Repeat("b", 40)
	var pushed atomic.Bool
	arrived, release := make(chan struct{}), make(chan struct{})
	var n atomic.Int32
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := A
		if pushed.Load() {
			id = B
		}
		if n.Add(1) == 1 {
			close(arrived)
			<-release
		}
		w.Header().Set("Content-Type", "application/x-git-upload-pack-advertisement")
		fmt.Fprint(w, pkt("# service=git-upload-pack\n")+"0000"+pkt(id+" refs/heads/main\x00caps\n")+"0000")
	}))
	defer srv.Close()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600)
	repo := policy.Repository{Tenant: "dev", Name: "demo", URL: srv.URL + "/demo.git", CA: ca}
	s, err := New(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	go s.remoteRefs(t.Context(), repo)
	<-arrived
	pushed.Store(true) // the push lands; now a submission starts
	got := make(chan string)
	go func() {
		r, err := s.remoteRefs(t.Context(), repo)
		if err != nil {
			t.Error(err)
		}
		got <- r.ids["refs/heads/main"]
	}()
	time.Sleep(100 * time.Millisecond)
	close(release)
	if id := <-got; id != B {
		t.Errorf("a listing begun after the push got main=%s..., want %s... (requests: %d)", id[:6], B[:6], n.Load())
	}
}
