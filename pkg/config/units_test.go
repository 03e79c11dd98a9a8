package config_test

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/airlockhq/airlock/pkg/config"
)

func TestParseByteSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		err  string
	}{
		{in: "0", want: 0},
		{in: "1048576", want: 1 << 20},
		{in: "512MiB", want: 512 << 20},
		{in: "2GiB", want: 2 << 30},
		{in: "1 KiB", want: 1024},
		{in: "10KB", want: 10_000},
		{in: "3MB", want: 3_000_000},
		{in: "1GB", want: 1_000_000_000},
		{in: "7B", want: 7},
		{in: "1TiB", want: 1 << 40},
		// As people coming from Kubernetes write them.
		{in: "1Gi", want: 1 << 30},
		{in: "512Mi", want: 512 << 20},
		{in: "64Ki", want: 64 << 10},
		{in: "2Ti", want: 2 << 40},
		{in: "1G", err: "Ki, Mi, Gi, Ti"},
		{in: "lots", err: "is not a size"},
		{in: "-1MiB", err: "is not a size"},
		{in: "+1", err: "is not a size"},
		{in: "1.5GiB", err: "is not a size"},
		{in: "MiB", err: "is not a size"},
		{in: "", err: "is not a size"},
		{in: "9999999TiB", err: "too large"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got, err := config.ParseByteSize(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseByteSize(%q) = %d, %v; want error containing %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseByteSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestFormatByteSize(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{{0, "0B"}, {512 << 20, "512MiB"}, {2 << 30, "2GiB"}, {1000, "1000B"}, {1536, "1536B"}, {3 << 10, "3KiB"}} {
		if got := config.FormatByteSize(tc.n); got != tc.want {
			t.Errorf("FormatByteSize(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestByteSizeYAML(t *testing.T) {
	var v struct {
		A config.ByteSize `yaml:"a"`
		B config.ByteSize `yaml:"b"`
		C config.ByteSize `yaml:"c"`
		D config.ByteSize `yaml:"d"`
	}
	if err := yaml.Unmarshal([]byte("a: 1024\nb: 2GiB\nc: lots\n"), &v); err != nil {
		t.Fatal(err)
	}
	if v.A.Bytes() != 1024 || v.B.Bytes() != 2<<30 || !v.A.IsSet() || v.D.IsSet() {
		t.Errorf("decoded %+v", v)
	}
	if err := v.A.Check("a"); err != nil {
		t.Errorf("a: %v", err)
	}
	if err := v.C.Check("x.c"); err == nil || !strings.HasPrefix(err.Error(), `x.c: "lots" is not a size`) {
		t.Errorf("c: %v", err)
	}
}

func TestFormatByteSizeApprox(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{{0, "0B"}, {900, "900B"}, {1536, "1.5KiB"}, {512 << 20, "512.0MiB"}, {3 << 30, "3.0GiB"}, {25125203968, "23.4GiB"}, {-2 << 30, "-2.0GiB"}} {
		if got := config.FormatByteSizeApprox(tc.n); got != tc.want {
			t.Errorf("FormatByteSizeApprox(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
