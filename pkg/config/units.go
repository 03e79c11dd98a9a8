package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// byteUnits are the suffixes a size may carry, longest first so that "MiB"
// is tried before "B". Binary and decimal units are both accepted because
// people write both; they mean what they say (1MB is 10^6 bytes).
var byteUnits = []struct {
	suffix string
	factor int64
}{
	{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
	{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
	// Kubernetes' spellings of the binary units.
	{"Ki", 1 << 10}, {"Mi", 1 << 20}, {"Gi", 1 << 30}, {"Ti", 1 << 40},
	{"B", 1},
}

// binaryUnits are the units sizes are written in, largest first.
var binaryUnits = []struct {
	suffix string
	factor int64
}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}}

// ParseByteSize reads a size in bytes: a non-negative integer ("1048576"),
// optionally followed by one of B, KiB, MiB, GiB, TiB (or Kubernetes' Ki,
// Mi, Gi, Ti, the same binary units), KB, MB, GB or TB ("512MiB", "1Gi",
// "2 GB"). Fractions are refused, so a size is always exact.
func ParseByteSize(s string) (int64, error) {
	text := strings.TrimSpace(s)
	factor := int64(1)
	for _, u := range byteUnits {
		if rest, ok := strings.CutSuffix(text, u.suffix); ok {
			text, factor = strings.TrimSpace(rest), u.factor
			break
		}
	}
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n < 0 || text == "" || text[0] == '+' {
		return 0, fmt.Errorf("%q is not a size: want a whole number of bytes, optionally with a unit: KiB, MiB, GiB, TiB (or Ki, Mi, Gi, Ti: the same binary units), KB, MB, GB, TB", s)
	}
	if n > math.MaxInt64/factor {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n * factor, nil
}

// FormatByteSize writes n with the largest binary unit that divides it
// exactly, so that FormatByteSize(ParseByteSize(x)) reads back as x for the
// sizes people write.
func FormatByteSize(n int64) string {
	for _, u := range binaryUnits {
		if n != 0 && n%u.factor == 0 {
			return strconv.FormatInt(n/u.factor, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// FormatByteSizeApprox writes n to one decimal in the largest binary unit
// it reaches ("23.4GiB", "512.0MiB", "900B"), for messages that compare
// sizes; FormatByteSize is the exact form.
func FormatByteSizeApprox(n int64) string {
	for _, u := range binaryUnits {
		if n >= u.factor || -n >= u.factor {
			return strconv.FormatFloat(float64(n)/float64(u.factor), 'f', 1, 64) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// ByteSize is a size in bytes as written in a config file: an integer or a
// string with a unit (see ParseByteSize). It decodes leniently, keeping a
// bad value's error instead of failing the decode, because only the
// validating code knows the field's path; it reports the problem with Check.
type ByteSize struct {
	bytes int64
	set   bool
	err   error
}

// Bytes returns the size; 0 when it was not written or is invalid.
func (b ByteSize) Bytes() int64 { return b.bytes }

// IsSet reports whether the file gave a value.
func (b ByteSize) IsSet() bool { return b.set }

// Check returns a FieldError for field if the written value was not a size.
func (b ByteSize) Check(field string) error {
	if b.err != nil {
		return Field(field, "%v", b.err)
	}
	return nil
}

// NewByteSize returns a set ByteSize of n bytes, for defaults and tests.
func NewByteSize(n int64) ByteSize { return ByteSize{bytes: n, set: true} }

// UnmarshalYAML implements yaml.Unmarshaler.
func (b *ByteSize) UnmarshalYAML(n *yaml.Node) error {
	*b = ByteSize{set: true}
	if n.Kind != yaml.ScalarNode {
		b.err = fmt.Errorf("want a size such as 512MiB, not a %s", kindName(n.Kind))
		return nil
	}
	b.bytes, b.err = ParseByteSize(n.Value)
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (b ByteSize) MarshalYAML() (any, error) { return FormatByteSize(b.bytes), nil }

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	case yaml.AliasNode:
		return "alias"
	}
	return "document"
}
