package fleet

import (
	"strings"
	"testing"
	"time"
)

func member(name string, classes []string, memFree, cpuFree, jobsFree int64) Member {
	return Member{Name: name, ID: "spiffe://airlock.test/service/executor/" + name, Address: name + ":7402",
		Report: Report{Classes: classes, Capacity: Capacity{MemoryBytes: 16 << 30, MemoryFree: memFree, CPUMillis: 8000, CPUFree: cpuFree,
			DiskBytes: 100 << 30, DiskFree: 100 << 30, Jobs: 10, JobsFree: jobsFree}}}
}

func none(string) held { return held{} }

// TestChoose is placement's decision: class, room (with this replica's
// reservations), drain and loss exclude; the image, the source and
// spreading a tenant's jobs prefer; and with none left it says why.
func TestChoose(t *testing.T) {
	runc, both := []string{"runc"}, []string{"runc", "runsc"}
	need := Need{Tenant: "dev", Class: "runc", MemoryBytes: 1 << 30, CPUMillis: 1000, DiskBytes: 1 << 30}
	t.Run("class", func(t *testing.T) {
		m, _ := choose([]Member{member("a", runc, 8<<30, 8000, 5), member("b", both, 1<<30, 1000, 1)},
			Need{Tenant: "dev", Class: "runsc", MemoryBytes: 1 << 30, CPUMillis: 1000}, nil, none, nil)
		if m == nil || m.Name != "b" {
			t.Fatalf("runsc placed on %v, want b (the only one running runsc)", m)
		}
	})
	t.Run("room", func(t *testing.T) {
		members := []Member{member("a", runc, 512<<20, 8000, 5), member("b", runc, 8<<30, 500, 5), member("c", runc, 8<<30, 8000, 0), member("d", runc, 2<<30, 2000, 1)}
		m, _ := choose(members, need, nil, none, nil)
		if m == nil || m.Name != "d" {
			t.Fatalf("placed on %v, want d (a lacks memory, b cpu, c job slots)", m)
		}
		// What this replica already reserved on d fills it.
		m, why := choose(members, need, nil, func(name string) held {
			if name == "d" {
				return held{memory: 1536 << 20, jobs: 1}
			}
			return held{}
		}, nil)
		if m != nil || !strings.Contains(why, "4 without room") {
			t.Fatalf("with d reserved: %v, %q", m, why)
		}
		// An executor that refused for room is held back until it reports.
		if m, _ := choose(members, need, nil, none, map[string]time.Time{"d": {}}); m != nil {
			t.Fatalf("a full executor was chosen: %v", m)
		}
	})
	t.Run("drained and lost", func(t *testing.T) {
		a, b := member("a", runc, 8<<30, 8000, 5), member("b", runc, 8<<30, 8000, 5)
		a.Draining, b.Lost = true, true
		m, why := choose([]Member{a, b}, need, nil, none, nil)
		if m != nil || !strings.Contains(why, "1 drained") {
			t.Fatalf("%v, %q", m, why)
		}
		b.Lost = false
		if m, _ := choose([]Member{a, b}, need, nil, none, nil); m == nil || m.Name != "b" {
			t.Fatalf("placed on %v, want b", m)
		}
		a.Draining, b.Lost = false, true
		if m, _ := choose([]Member{a, b}, Need{Tenant: "dev", Class: "runc", Exclude: []string{a.ID}}, nil, none, nil); m != nil {
			t.Fatalf("an excluded executor was chosen: %v", m)
		}
	})
	t.Run("prefers", func(t *testing.T) {
		a, b, c := member("a", runc, 8<<30, 8000, 5), member("b", runc, 4<<30, 8000, 5), member("c", runc, 2<<30, 8000, 5)
		// By free memory alone: a.
		if m, _ := choose([]Member{a, b, c}, need, nil, none, nil); m.Name != "a" {
			t.Fatalf("placed on %s, want a (most memory free)", m.Name)
		}
		// c holds the source: c.
		c.Report.Sources = []string{"dev/demo"}
		n := need
		n.Source = "dev/demo"
		if m, _ := choose([]Member{a, b, c}, n, nil, none, nil); m.Name != "c" {
			t.Fatalf("placed on %s, want c (holds the source)", m.Name)
		}
		// b holds the image, which outweighs the source.
		b.Report.Images = []string{"sha256:abc"}
		n.Image = "sha256:abc"
		if m, _ := choose([]Member{a, b, c}, n, nil, none, nil); m.Name != "b" {
			t.Fatalf("placed on %s, want b (holds the image)", m.Name)
		}
		// The tenant already runs 7 jobs on b: spread to c.
		if m, _ := choose([]Member{a, b, c}, n, map[string]int64{b.ID: 7}, none, nil); m.Name != "c" {
			t.Fatalf("placed on %s, want c (the tenant's jobs spread)", m.Name)
		}
	})
	t.Run("why", func(t *testing.T) {
		if _, why := choose(nil, need, nil, none, nil); why != "no executor of the fleet runs runtime class runc" {
			t.Errorf("empty fleet: %q", why)
		}
		b := member("b", runc, 8<<30, 8000, 5)
		b.Lost = true
		if _, why := choose([]Member{b}, need, nil, none, nil); why != "every executor that runs runtime class runc is lost" {
			t.Errorf("all lost: %q", why)
		}
	})
}
