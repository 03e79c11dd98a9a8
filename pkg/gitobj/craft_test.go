package gitobj

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
)

// This file writes object directories by hand, for what git would never
// write: hostile and corrupt packs, reference deltas across packs, the
// 64-bit offset table.

// objectID is the SHA-1 id of an object.
func objectID(typ string, data []byte) []byte {
	h := sha1.New()
	fmt.Fprintf(h, "%s %d\x00", typ, len(data))
	h.Write(data)
	return h.Sum(nil)
}

func deflate(b []byte) []byte {
	var buf bytes.Buffer
	zw := zlib.NewWriter(&buf)
	zw.Write(b)
	zw.Close()
	return buf.Bytes()
}

// writeLoose writes a loose object file holding raw (a header and content,
// or anything else) under id.
func writeLoose(t *testing.T, objects string, id []byte, raw []byte) {
	t.Helper()
	h := hex.EncodeToString(id)
	writeFile(t, filepath.Join(objects, h[:2], h[2:]), deflate(raw))
}

// rawEntry is one entry of a crafted pack.
type rawEntry struct {
	id   []byte // what the index lists it as
	typ  int
	size int64  // the header's size
	base int    // objOfsDelta: the index of an earlier entry
	ref  []byte // objRefDelta: the base id
	body []byte // deflated as the entry's data
}

// encodeSize writes a delta's size varint.
func encodeSize(n int) []byte {
	var b []byte
	for {
		c := byte(n & 0x7f)
		n >>= 7
		if n == 0 {
			return append(b, c)
		}
		b = append(b, c|0x80)
	}
}

// encodeEntryHeader writes an entry's type and size.
func encodeEntryHeader(typ int, size int64) []byte {
	c := byte(typ<<4) | byte(size&0x0f)
	size >>= 4
	var b []byte
	for size > 0 {
		b = append(b, c|0x80)
		c = byte(size & 0x7f)
		size >>= 7
	}
	return append(b, c)
}

// encodeOfs writes an offset delta's distance, git's way.
func encodeOfs(d uint64) []byte {
	b := []byte{byte(d & 0x7f)}
	for d >>= 7; d > 0; d >>= 7 {
		d--
		b = append([]byte{byte(0x80 | d&0x7f)}, b...)
	}
	return b
}

// writePack writes objects/pack/pack-name.{pack,idx} from entries; with
// large every offset goes through the 64-bit table.
func writePack(t *testing.T, objects, name string, entries []rawEntry, large bool) {
	t.Helper()
	var pack bytes.Buffer
	pack.WriteString("PACK")
	binary.Write(&pack, binary.BigEndian, uint32(2))
	binary.Write(&pack, binary.BigEndian, uint32(len(entries)))
	offs := make([]int64, len(entries))
	for i, e := range entries {
		offs[i] = int64(pack.Len())
		pack.Write(encodeEntryHeader(e.typ, e.size))
		switch e.typ {
		case objOfsDelta:
			pack.Write(encodeOfs(uint64(offs[i] - offs[e.base])))
		case objRefDelta:
			pack.Write(e.ref)
		}
		pack.Write(deflate(e.body))
	}
	sum := sha1.Sum(pack.Bytes())
	pack.Write(sum[:])
	var rows []idxRow
	for i, e := range entries {
		rows = append(rows, idxRow{e.id, offs[i]})
	}
	writeFile(t, filepath.Join(objects, "pack", "pack-"+name+".pack"), pack.Bytes())
	writeIndex(t, filepath.Join(objects, "pack", "pack-"+name+".idx"), sum[:], rows, large)
}

// idxRow is an object an index lists, and where its entry is.
type idxRow struct {
	id  []byte
	off int64
}

// writeIndex writes a version 2 index of rows for the pack whose checksum
// is packSum; with large every offset goes through the 64-bit table.
func writeIndex(t *testing.T, path string, packSum []byte, rows []idxRow, large bool) {
	t.Helper()
	sort.Slice(rows, func(i, j int) bool { return bytes.Compare(rows[i].id, rows[j].id) < 0 })
	var idx bytes.Buffer
	idx.WriteString("\377tOc")
	binary.Write(&idx, binary.BigEndian, uint32(2))
	for b := 0; b < 256; b++ {
		n := 0
		for _, r := range rows {
			if int(r.id[0]) <= b {
				n++
			}
		}
		binary.Write(&idx, binary.BigEndian, uint32(n))
	}
	for _, r := range rows {
		idx.Write(r.id)
	}
	idx.Write(make([]byte, 4*len(rows))) // CRCs, which readers do not check
	for i, r := range rows {
		v := uint32(r.off)
		if large {
			v = 0x80000000 | uint32(i)
		}
		binary.Write(&idx, binary.BigEndian, v)
	}
	if large {
		for _, r := range rows {
			binary.Write(&idx, binary.BigEndian, uint64(r.off))
		}
	}
	idx.Write(packSum)
	isum := sha1.Sum(idx.Bytes())
	idx.Write(isum[:])
	writeFile(t, path, idx.Bytes())
}

// makeDelta returns a delta turning base into base[:cut] + insert +
// base[cut:], by two copies and an insert.
func makeDelta(base []byte, cut int, insert []byte) []byte {
	d := append(encodeSize(len(base)), encodeSize(len(base)+len(insert))...)
	copyOp := func(off, size int) {
		d = append(d, 0x80|0x0f|0x70)
		d = binary.LittleEndian.AppendUint32(d, uint32(off))
		d = append(d, byte(size), byte(size>>8), byte(size>>16))
	}
	copyOp(0, cut)
	d = append(d, byte(len(insert)))
	d = append(d, insert...)
	copyOp(cut, len(base)-cut)
	return d
}

func newObjects(t *testing.T) string {
	objects := filepath.Join(t.TempDir(), "objects")
	if err := os.MkdirAll(filepath.Join(objects, "pack"), 0o755); err != nil {
		t.Fatal(err)
	}
	return objects
}
