package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
)

func frame(n uint32, stream uint32, t byte, payload []byte) []byte {
	b := binary.BigEndian.AppendUint32(nil, n)
	b = binary.BigEndian.AppendUint32(b, stream)
	return append(append(b, t), payload...)
}

func TestRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	if err := w.WriteJSON(3, TypeExit, Exit{Code: 137, Signal: 9, OOMKills: 1}); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(3, TypeStdout, []byte("hi\n")); err != nil {
		t.Fatal(err)
	}
	r := NewReader(&buf)
	f, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	var e Exit
	if err := Decode(f, &e); err != nil || f.Stream != 3 || e != (Exit{Code: 137, Signal: 9, OOMKills: 1}) {
		t.Fatalf("got %+v %+v %v", f, e, err)
	}
	if f, err = r.Read(); err != nil || string(f.Payload) != "hi\n" || f.Type != TypeStdout {
		t.Fatalf("got %+v %v", f, err)
	}
	if _, err = r.Read(); err != io.EOF {
		t.Fatalf("at the end: %v, want EOF", err)
	}
}

func TestHostileFrames(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []byte
		want error
	}{
		{"huge length", frame(0xffffffff, 0, byte(TypeStdout), nil), ErrProtocol},
		{"length just over", frame(MaxPayload+6, 0, byte(TypeStdout), nil), ErrProtocol},
		{"length under header", frame(4, 0, byte(TypeStdout), nil), ErrProtocol},
		{"type zero", frame(5, 0, 0, nil), ErrProtocol},
		{"type unknown", frame(5, 0, 200, nil), ErrProtocol},
		{"truncated payload", frame(10, 0, byte(TypeStdout), []byte("ab")), io.ErrUnexpectedEOF},
		{"truncated header", []byte{0, 0, 0}, io.ErrUnexpectedEOF},
	} {
		_, err := NewReader(bytes.NewReader(tc.in)).Read()
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	for _, payload := range []string{`{`, `{"code":1,"bogus":2}`, `{"code":"x"}`, `{"code":1} {}`, `null x`} {
		var e Exit
		if err := Decode(Frame{Type: TypeExit, Payload: []byte(payload)}, &e); !errors.Is(err, ErrProtocol) {
			t.Errorf("decode %q: got %v, want a protocol error", payload, err)
		}
	}
	if err := NewWriter(io.Discard).Write(1, TypeStdout, make([]byte, MaxPayload+1)); err == nil {
		t.Error("writing an oversized frame succeeded")
	}
	for _, p := range [][]byte{nil, {0}, {0xff, 0xff, 'a'}, {0, 1, 'a', 0, 0}} {
		if _, _, _, err := DecodeFileChunk(p); !errors.Is(err, ErrProtocol) {
			t.Errorf("file chunk %q: got %v", p, err)
		}
	}
}

func TestValidate(t *testing.T) {
	good := Config{Shares: []Share{{Tag: RootTag, Path: "/", RO: true}}}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"no root", func(c *Config) { c.Shares = nil }, `no "root" share`},
		{"relative share", func(c *Config) { c.Shares = append(c.Shares, Share{Tag: "a", Path: "x"}) }, "shares[1] path"},
		{"share at /", func(c *Config) { c.Shares = append(c.Shares, Share{Tag: "a", Path: "/"}) }, "only the"},
		{"dotdot file", func(c *Config) { c.Files = []File{{Path: "/etc/../x"}} }, "files[0] path"},
		{"big file", func(c *Config) { c.Files = []File{{Path: "/x", Size: MaxFileSize + 1}} }, "size"},
		{"bad mac", func(c *Config) { c.Network = &Network{MAC: "zz"} }, "network mac"},
		{"bad prefix", func(c *Config) { c.Network = &Network{MAC: "02:00:00:00:00:01", Addresses: []string{"10.0.0.1"}} }, "addresses[0]"},
		{"v6 gateway4", func(c *Config) { c.Network = &Network{MAC: "02:00:00:00:00:01", Gateway4: "fe80::1"} }, "gateway4"},
		{"docker without disk", func(c *Config) { c.Docker = true }, "docker"},
	} {
		c := good
		c.Shares = append([]Share(nil), good.Shares...)
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
	for _, p := range []Process{{}, {Args: []string{"a\x00"}}, {Args: []string{"a"}, Cwd: "rel"},
		{Args: []string{"a"}, Rlimits: []Rlimit{{Type: "RLIMIT_NOFILE", Soft: 2, Hard: 1}}}} {
		if err := p.Validate(); err == nil {
			t.Errorf("process %+v validated", p)
		}
	}
}

func FuzzReader(f *testing.F) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.WriteJSON(0, TypeHello, Hello{Version: "v", Kernel: "k"})
	w.WriteJSON(1, TypeStart, Process{Args: []string{"/bin/sh"}})
	f.Add(buf.Bytes())
	f.Add(frame(0xffffffff, 0, 1, nil))
	f.Add(frame(9, 0, byte(TypeFile), []byte{0, 1, 'a', 0, 0, 1, 0xa4}))
	f.Fuzz(func(t *testing.T, in []byte) {
		r := NewReader(bytes.NewReader(in))
		for {
			fr, err := r.Read()
			if err != nil {
				return
			}
			var c Config
			if Decode(fr, &c) == nil {
				c.Validate()
			}
			var p Process
			if Decode(fr, &p) == nil {
				p.Validate()
			}
			DecodeFileChunk(fr.Payload)
		}
	})
}
