package ocilayer

import (
	"bytes"
	"context"
	"testing"
)

var fuzzMediaTypes = []string{MediaTypeOCILayer, MediaTypeOCILayerGzip, MediaTypeOCILayerZstd}

// FuzzUnpack: no layer, however malformed, panics Unpack or changes
// anything beside dst (a sibling canary directory stays as it was).
func FuzzUnpack(f *testing.F) {
	seed := func(raw []byte) {
		f.Add(uint8(0), raw)
		f.Add(uint8(1), gzipBytes(f, raw))
		f.Add(uint8(2), zstdBytes(f, raw))
	}
	seed(layerTar(f, realistic()...))
	for _, c := range hostileCases() {
		seed(layerTar(f, c.withCanary("/canary")...))
	}
	seed(append(layerTar(f, reg("f", "x")), make([]byte, 4096)...))
	f.Fuzz(func(t *testing.T, kind uint8, data []byte) {
		s := newSandbox(t)
		opt := Options{UIDBase: testBase, MaxEntries: 512, MaxFileBytes: 1 << 20, MaxTotalBytes: 4 << 20}
		mediaType := fuzzMediaTypes[int(kind)%len(fuzzMediaTypes)]
		st, err := Unpack(context.Background(), bytes.NewReader(data), mediaType, s.dst, opt)
		s.checkCanary(t)
		if err == nil && (st.DiffID == "" || st.Entries > opt.MaxEntries || st.Bytes > opt.MaxTotalBytes) {
			t.Errorf("stats out of bounds: %+v", st)
		}
	})
}
