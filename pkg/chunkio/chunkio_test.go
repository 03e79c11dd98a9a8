package chunkio

import (
	"errors"
	"io"
	"testing"
)

func TestReader(t *testing.T) {
	chunks := [][]byte{[]byte("ab"), nil, []byte("cde"), {}, []byte("f")}
	r := NewReader(func() ([]byte, error) {
		if len(chunks) == 0 {
			return nil, io.EOF
		}
		c := chunks[0]
		chunks = chunks[1:]
		return c, nil
	})
	got, err := io.ReadAll(r)
	if err != nil || string(got) != "abcdef" {
		t.Fatalf("read %q, %v", got, err)
	}
	boom := errors.New("boom")
	r = NewReader(func() ([]byte, error) { return nil, boom })
	if _, err := r.Read(make([]byte, 4)); !errors.Is(err, boom) {
		t.Fatalf("the source's error: %v", err)
	}
}
