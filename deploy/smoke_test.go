package deploy

import "testing"

func TestSmoke(t *testing.T) {
	out, err := renderManifest(nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(out)
	if _, err := decodeAll(out); err != nil {
		t.Fatal(err)
	}
}
