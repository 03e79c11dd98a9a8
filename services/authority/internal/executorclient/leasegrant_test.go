package executorclient

import (
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// TestLeaseGrant: a brokered lease reads the credentials' names and the
// deadline from the stored grant, and nothing from bytes that are none.
func TestLeaseGrant(t *testing.T) {
	body, err := proto.Marshal(&typesv1.Grant{JobId: "j1", Credentials: []string{"github", "npm"},
		Limits: &typesv1.ResourceLimits{Deadline: durationpb.New(20 * time.Minute)}})
	if err != nil {
		t.Fatal(err)
	}
	wire, err := proto.Marshal(&typesv1.SignedGrant{Body: body})
	if err != nil {
		t.Fatal(err)
	}
	g, err := LeaseGrant(wire)
	if err != nil || !slices.Equal(g.Credentials, []string{"github", "npm"}) || g.Deadline != 20*time.Minute {
		t.Fatalf("LeaseGrant = %+v, %v", g, err)
	}
	if _, err := LeaseGrant([]byte("not a grant")); err == nil {
		t.Fatal("LeaseGrant read garbage")
	}
}
