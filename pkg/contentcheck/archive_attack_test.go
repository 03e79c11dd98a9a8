package contentcheck

import (
	"archive/tar"
	"archive/zip"
	"bytes"
	"compress/bzip2"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"io"
	"strings"
	"testing"
	"time"
)

// These tests attack the unpacking from the side of a job that wants a
// secret out through /out unseen.

// secretText is a line with a token, long enough that deflate does not
// leave it readable.
func secretText(seed uint64) string {
	return strings.Repeat("filler text that compresses well\n", 20) + "token=" + githubToken(seed) + "\n"
}

// zipBuilt writes members (name, content) deflated, at offset into a
// longer file (zip.Writer.SetOffset, as `zip -A` adjusts a
// self-extracting zip) when offset > 0.
func zipBuilt(t testing.TB, offset int64, members ...string) []byte {
	t.Helper()
	var b bytes.Buffer
	w := zip.NewWriter(&b)
	w.SetOffset(offset)
	for i := 0; i < len(members); i += 2 {
		f, err := w.CreateHeader(&zip.FileHeader{Name: members[i], Method: zip.Deflate})
		if err != nil {
			t.Fatal(err)
		}
		f.Write([]byte(members[i+1]))
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// dirRecord finds name's record in a zip's central directory: the
// directory end's offset, the directory's length, and the record's offset
// and length.
func dirRecord(t testing.TB, z []byte, name string) (end, dirLen, at, size int) {
	t.Helper()
	le := binary.LittleEndian
	end = bytes.LastIndex(z, []byte("PK\x05\x06"))
	dirOff, dirLen := int(le.Uint32(z[end+16:])), int(le.Uint32(z[end+12:]))
	for p := dirOff; p < dirOff+dirLen; p += size {
		n, m, k := int(le.Uint16(z[p+28:])), int(le.Uint16(z[p+30:])), int(le.Uint16(z[p+32:]))
		size = 46 + n + m + k
		if string(z[p+46:p+46+n]) == name {
			return end, dirLen, p, size
		}
	}
	t.Fatalf("no %q in the directory", name)
	return
}

// unlist removes name's record from a zip's central directory (the
// local entry stays where it is) and fixes the directory's end to match.
func unlist(t testing.TB, z []byte, name string) []byte {
	t.Helper()
	end, dirLen, at, size := dirRecord(t, z, name)
	out := append(bytes.Clone(z[:at]), z[at+size:]...)
	e := end - size
	le := binary.LittleEndian
	le.PutUint16(out[e+8:], le.Uint16(out[e+8:])-1)
	le.PutUint16(out[e+10:], le.Uint16(out[e+10:])-1)
	le.PutUint32(out[e+12:], uint32(dirLen-size))
	return out
}

func TestUnlistHelper(t *testing.T) {
	z := unlist(t, zipBuilt(t, 0, "a", "1", "h", "2", "c", "3"), "h")
	zr, err := zip.NewReader(bytes.NewReader(z), int64(len(z)))
	if err != nil {
		t.Fatal(err)
	}
	if len(zr.File) != 2 || zr.File[0].Name != "a" || zr.File[1].Name != "c" {
		t.Fatalf("unlist left %d members", len(zr.File))
	}
}

// A zip after other bytes is still a zip to unzip (which finds it from
// its end): a self-extracting zip with or without its offsets adjusted,
// and a zip appended to a tar, which tar and unzip each read.
func TestOutZipAfterOtherBytesIsUnpacked(t *testing.T) {
	stub := []byte("#!/bin/sh\nexec unzip \"$0\"\n" + strings.Repeat("\x7fELF program bytes\x00\x01", 50))
	for _, tc := range []struct {
		name       string
		data       []byte
		rule, path string
	}{
		{"stub then zip", append(bytes.Clone(stub), zipBuilt(t, 0, "a.txt", "hello\n", "b.txt", secretText(60))...), "secret.github-pat", "/out/x.bin!b.txt"},
		{"stub then adjusted zip", append(bytes.Clone(stub), zipBuilt(t, int64(len(stub)), "a.txt", "hello\n", "b.txt", secretText(60))...), "secret.github-pat", "/out/x.bin!b.txt"},
		{"tar then zip", append(tarOf(t, "a.txt", []byte("hello\n")), zipBuilt(t, 0, "b.txt", secretText(60))...), "secret.github-pat", "/out/x.bin!b.txt"},
		// The first zip's entries are not the directory's: refused.
		{"zip then zip", append(zipBuilt(t, 0, "a.txt", "hello\n"), zipBuilt(t, 0, "b.txt", secretText(60))...), RuleArchiveUnscannable, "/out/x.bin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if fs := checkOut(t, Policy{}, "x.bin", tc.data); !hasFinding(fs, tc.rule, tc.path) {
				t.Errorf("want %s on %s:%s", tc.rule, tc.path, show(fs))
			}
		})
	}
	// A tar (or tar.gz) of zips ends like a zip, its last member's: that
	// zip is read as the member it is, and the others are not taken for
	// members of an appended zip.
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	for _, m := range []struct{ name, body string }{{"a.zip", string(zipBuilt(t, 0, "a.txt", secretText(71)))}, {"b.zip", string(zipBuilt(t, 0, "b.txt", "hello\n"))}} {
		tw.WriteHeader(&tar.Header{Name: m.name, Mode: 0o644, Size: int64(len(m.body)), Typeflag: tar.TypeReg})
		tw.Write([]byte(m.body))
	}
	tw.Close()
	for name, data := range map[string][]byte{"zips.tar": tb.Bytes(), "zips.tgz": gz(t, "", tb.Bytes())} {
		fs := checkOut(t, Policy{}, name, data)
		if len(fs) != 1 || fs[0].Rule != "secret.github-pat" || !strings.HasSuffix(fs[0].Path, "!a.zip!a.txt") {
			t.Errorf("%s: want the one secret in a.zip:%s", name, show(fs))
		}
	}
	// Clean, it passes; and it counts as a layer for the depth bound.
	if fs := checkOut(t, Policy{}, "sfx", append(bytes.Clone(stub), zipBuilt(t, 0, "a.txt", "hello\n")...)); len(fs) != 0 {
		t.Errorf("a clean self-extracting zip:%s", show(fs))
	}
	data := []byte(secretText(61))
	for range MaxArchiveDepth {
		data = append(bytes.Clone(stub), zipBuilt(t, 0, "in", string(data))...)
	}
	if fs := checkOut(t, Policy{}, "deep", data); !hasFinding(fs, "secret.github-pat", "/out/deep!in!in!in") {
		t.Errorf("%d self-extracting layers:%s", MaxArchiveDepth, show(fs))
	}
	data = append(bytes.Clone(stub), zipBuilt(t, 0, "in", string(data))...)
	if fs := checkOut(t, Policy{}, "deeper", data); !hasFinding(fs, RuleArchiveUnscannable, "/out/deeper") {
		t.Errorf("%d self-extracting layers:%s", MaxArchiveDepth+1, show(fs))
	}
}

func mustHex(s string) []byte {
	b, err := hex.DecodeString(s)
	if err != nil {
		panic(err)
	}
	return b
}

// Formats this package does not unpack are refused, never passed as the
// opaque bytes they are. Each stream below holds "hello, these bytes are
// packed\n", made by the tool named.
func TestOutUnknownFormatsAreRefused(t *testing.T) {
	for name, data := range map[string][]byte{
		"xz":          mustHex("fd377a585a000004e6d6b4460200210116000000742fe5a301001d68656c6c6f2c20746865736520627974657320617265207061636b65640a000000d07e86489e92e6c40001361e3d1995531fb6f37d010000000004595a"),
		"lzma":        mustHex("5d00008000ffffffffffffffff00341949ee8def8c6b6e6bda7644fea380f34c3d263a77ae538c9a2f084067392be2ffff6f184000"),
		"zstd":        mustHex("28b52ffd0458f1000068656c6c6f2c20746865736520627974657320617265207061636b65640ad5ac04f8"),
		"zstd-skip":   append(mustHex("502a4d1804000000abcd1234"), mustHex("28b52ffd0458f1000068656c6c6f2c20746865736520627974657320617265207061636b65640ad5ac04f8")...),
		"lz4":         mustHex("04224d186440a71e00008068656c6c6f2c20746865736520627974657320617265207061636b65640a00000000f046ce39"),
		"lz4-legacy":  mustHex("02214c1820000000f00f68656c6c6f2c20746865736520627974657320617265207061636b65640a"),
		"7z":          append([]byte("7z\xbc\xaf\x27\x1c\x00\x04"), bytes.Repeat([]byte{0x5a, 0x17}, 40)...),
		"rar4":        append([]byte("Rar!\x1a\x07\x00"), bytes.Repeat([]byte{0x5a, 0x17}, 40)...),
		"rar5":        append([]byte("Rar!\x1a\x07\x01\x00"), bytes.Repeat([]byte{0x5a, 0x17}, 40)...),
		"xz in a zip": zipBuilt(t, 0, "a.xz", string(mustHex("fd377a585a000004e6d6b4460200210116000000742fe5a301001d68656c6c6f2c20746865736520627974657320617265207061636b65640a000000d07e86489e92e6c40001361e3d1995531fb6f37d010000000004595a"))),
	} {
		if fs := checkOut(t, Policy{}, name, data); !hasFinding(fs, RuleArchiveUnscannable, "/out/"+name) {
			t.Errorf("%s passed:%s", name, show(fs))
		}
	}
	// Plain text, binaries and zeros are not taken for one.
	for name, data := range map[string][]byte{
		"text": []byte("x^2 + y^2\nhello\n"), "zeros": make([]byte, 4096), "elf": append([]byte("\x7fELF\x02\x01\x01"), make([]byte, 600)...),
		"pdf": []byte("%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n"),
	} {
		if fs := checkOut(t, Policy{}, name, data); len(fs) != 0 {
			t.Errorf("%s refused:%s", name, show(fs))
		}
	}
}

// bzip2 and zlib are unpacked and scanned. The bzip2 stream is
// "token=" + githubToken(41) + "\n" made by bzip2 -9 (the standard
// library has no bzip2 writer); the test checks it is.
func TestOutBzip2AndZlibAreUnpacked(t *testing.T) {
	bz := mustHex("425a6839314159265359fd064b490000164f8000106322301533d083cbf4c02000318d31184698000031ea1a01a034c9e24f26a42a4cbb79191ec2112de87e040d124f115f95b18b8dcd29cc15968df8bb9229c28487e8325a48")
	if got, err := io.ReadAll(bzip2.NewReader(bytes.NewReader(bz))); err != nil || string(got) != "token="+githubToken(41)+"\n" {
		t.Fatalf("the bzip2 fixture does not hold the token (%v)", err)
	}
	var zb bytes.Buffer
	zw := zlib.NewWriter(&zb)
	zw.Write([]byte(secretText(42)))
	zw.Close()
	for _, tc := range []struct {
		name string
		data []byte
		path string
	}{
		{"t.bz2", bz, "/out/t.bz2!"},
		{"t.zz", zb.Bytes(), "/out/t.zz!"},
		{"t.zip", zipBuilt(t, 0, "in.bz2", string(bz)), "/out/t.zip!in.bz2!"},
		// Cut short, what decoded is scanned.
		{"cut.zz", zb.Bytes()[:zb.Len()-4], "/out/cut.zz!"},
	} {
		if fs := checkOut(t, Policy{}, tc.name, tc.data); !hasFinding(fs, "secret.github-pat", tc.path) {
			t.Errorf("%s:%s", tc.name, show(fs))
		}
	}
	for name, data := range map[string][]byte{"cut.bz2": bz[:len(bz)-8], "tail.zz": append(bytes.Clone(zb.Bytes()), "more"...)} {
		if fs := checkOut(t, Policy{}, name, data); !hasFinding(fs, RuleArchiveUnscannable, "/out/"+name) {
			t.Errorf("%s:%s", name, show(fs))
		}
	}
}

// deflated is data as a raw deflate stream.
func deflated(data []byte) []byte {
	var b bytes.Buffer
	w, _ := flate.NewWriter(&b, flate.BestCompression)
	w.Write(data)
	w.Close()
	return b.Bytes()
}

// rawZip writes one member from its raw (already packed) bytes and the
// header given, as a crafting tool would.
func rawZip(t testing.TB, fh *zip.FileHeader, raw []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w := zip.NewWriter(&b)
	f, err := w.CreateRaw(fh)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(raw)
	w.Close()
	return b.Bytes()
}

// relist adds copies of name's directory record under another name of
// the same length: more members of the directory with one local entry.
func relist(t testing.TB, z []byte, name, other string, copies int) []byte {
	t.Helper()
	end, dirLen, at, size := dirRecord(t, z, name)
	rec := bytes.Clone(z[at : at+size])
	copy(rec[46:], other)
	out := bytes.Clone(z[:end])
	for range copies {
		out = append(out, rec...)
	}
	tail := bytes.Clone(z[end:])
	le := binary.LittleEndian
	le.PutUint16(tail[8:], le.Uint16(tail[8:])+uint16(copies))
	le.PutUint16(tail[10:], le.Uint16(tail[10:])+uint16(copies))
	le.PutUint32(tail[12:], uint32(dirLen+copies*size))
	return append(out, tail...)
}

// A local entry the directory does not list is read by a reader that
// streams the zip (and by repair tools), not by one that reads the
// directory, as this package does: it is refused wherever it is.
func TestOutZipUnlistedLocalEntryIsRefused(t *testing.T) {
	hidden := secretText(62)
	// A local entry of the hidden member, as a streaming reader would
	// meet it inside another member's data.
	one := zipBuilt(t, 0, "h", hidden)
	entry := one[:bytes.Index(one, []byte("PK\x01\x02"))]
	clean := []byte("hello\n")
	stuffed := rawZip(t, &zip.FileHeader{Name: "a", Method: zip.Deflate, CRC32: crc32.ChecksumIEEE(clean),
		UncompressedSize64: uint64(len(clean)), CompressedSize64: uint64(len(deflated(clean)) + len(entry))}, append(deflated(clean), entry...))
	renamed := zipBuilt(t, 0, "aaaa.txt", "hello\n")
	copy(renamed[30:], "bbbb.txt") // the local name only
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"first", unlist(t, zipBuilt(t, 0, "h", hidden, "a", "hello\n"), "h")},
		{"between", unlist(t, zipBuilt(t, 0, "a", "hello\n", "h", hidden, "c", "bye\n"), "h")},
		{"last", unlist(t, zipBuilt(t, 0, "a", "hello\n", "h", hidden), "h")},
		{"alone", unlist(t, zipBuilt(t, 0, "h", hidden), "h")},
		{"after a stub", append([]byte("#!/bin/sh\n"), unlist(t, zipBuilt(t, 0, "a", "hello\n", "h", hidden), "h")...)},
		{"inside a member's data", stuffed},
		{"local name differs", renamed},
		{"listed twice", relist(t, zipBuilt(t, 0, "a", "hello\n"), "a", "b", 1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := zip.NewReader(bytes.NewReader(tc.data), int64(len(tc.data))); err != nil {
				t.Fatalf("the crafted zip does not read: %v", err)
			}
			if fs := checkOut(t, Policy{}, "x.zip", tc.data); !hasFinding(fs, RuleArchiveUnscannable, "/out/x.zip") {
				t.Errorf("passed:%s", show(fs))
			}
		})
	}
	// What Go's, Python's and Info-ZIP's writers make passes: data
	// descriptors (Go writes them for every member), stored members, a
	// directory, an empty zip, zip64 sizes.
	var b bytes.Buffer
	w := zip.NewWriter(&b)
	w.Create("dir/")
	f, _ := w.CreateHeader(&zip.FileHeader{Name: "dir/s", Method: zip.Store})
	f.Write([]byte("stored\n"))
	f, _ = w.CreateHeader(&zip.FileHeader{Name: "dir/d", Method: zip.Deflate})
	f.Write([]byte("deflated\n"))
	w.Close()
	for name, data := range map[string][]byte{
		"go.zip":     b.Bytes(),
		"empty.zip":  zipBuilt(t, 0),
		"raw.zip":    rawZip(t, &zip.FileHeader{Name: "r", Method: zip.Deflate, CRC32: crc32.ChecksumIEEE(clean), UncompressedSize64: uint64(len(clean)), CompressedSize64: uint64(len(deflated(clean)))}, deflated(clean)),
		"zip64.zip":  zip64Of(t, clean),
		"nested.zip": zipBuilt(t, 0, "in.zip", string(b.Bytes())),
	} {
		if fs := checkOut(t, Policy{}, name, data); len(fs) != 0 {
			t.Errorf("%s:%s", name, show(fs))
		}
	}
}

// zip64Of is a one-member zip whose member carries zip64 sizes (Go
// writes them for a member declared over 4 GiB; this one is small).
func zip64Of(t testing.TB, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	w := zip.NewWriter(&b)
	f, err := w.CreateHeader(&zip.FileHeader{Name: "z", Method: zip.Deflate, UncompressedSize64: 1 << 33})
	if err != nil {
		t.Fatal(err)
	}
	f.Write(data)
	w.Close()
	return b.Bytes()
}

// A tar header's owner and group names, link target and PAX records, and
// the bytes the reader passes over (padding, unused header fields), are
// scanned: they are in the file for anyone to read.
func TestOutTarHeadersAreScanned(t *testing.T) {
	aws, tok := awsKeyID(63), githubToken(64)
	build := func(h *tar.Header, data []byte) []byte {
		var b bytes.Buffer
		w := tar.NewWriter(&b)
		h.Size = int64(len(data))
		if err := w.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		w.Write(data)
		w.Close()
		return b.Bytes()
	}
	reg := func(h tar.Header) *tar.Header {
		h.Name, h.Mode, h.Typeflag = "f.txt", 0o644, tar.TypeReg
		return &h
	}
	padded := build(reg(tar.Header{}), []byte("hello\n"))
	copy(padded[512+100:], "token="+tok+"\n")
	gnu := build(reg(tar.Header{Format: tar.FormatGNU}), []byte("hello\n"))
	copy(gnu[386:], tok) // the GNU sparse map, unused by a regular file
	setChecksum(gnu[:512])
	for _, tc := range []struct {
		name string
		data []byte
		rule string
		path string
	}{
		{"owner name", build(reg(tar.Header{Uname: aws}), []byte("hi\n")), "secret.aws-access-token", "/out/x.tar!f.txt"},
		{"group name", build(reg(tar.Header{Gname: aws}), []byte("hi\n")), "secret.aws-access-token", "/out/x.tar!f.txt"},
		{"long owner name", build(reg(tar.Header{Uname: tok}), []byte("hi\n")), "secret.github-pat", "/out/x.tar!f.txt"},
		{"PAX record", build(reg(tar.Header{PAXRecords: map[string]string{"comment": "token=" + tok}}), []byte("hi\n")), "secret.github-pat", "/out/x.tar!f.txt"},
		{"link target", build(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: tok}, nil), "secret.github-pat", "/out/x.tar!l"},
		{"padding", padded, "secret.github-pat", "/out/x.tar"},
		{"unused header field", gnu, "secret.github-pat", "/out/x.tar"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := tar.NewReader(bytes.NewReader(tc.data)).Next(); err != nil {
				t.Fatalf("the crafted tar does not read: %v", err)
			}
			if fs := checkOut(t, Policy{}, "x.tar", tc.data); !hasFinding(fs, tc.rule, tc.path) {
				t.Errorf("want %s on %s:%s", tc.rule, tc.path, show(fs))
			}
		})
	}
}

// setChecksum rewrites a tar header's checksum after an edit.
func setChecksum(h []byte) {
	copy(h[148:156], "        ")
	var sum int64
	for _, c := range h[:512] {
		sum += int64(c)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
}

// More of what a job might try: a secret in a gzip header's extra field,
// in a second gzip member, in a pre-POSIX tar (no magic) of a gzip, in a
// tar in a gzip in a zip; a zip member whose declared size lies, one
// packed with bzip2; many members spread over nested archives.
func TestOutArchiveEvasions(t *testing.T) {
	tok := githubToken(65)
	var extra bytes.Buffer
	gw := gzip.NewWriter(&extra)
	gw.Extra = []byte("token=" + tok)
	gw.Write([]byte("hello\n"))
	gw.Close()
	v7 := tarOf(t, "p.gz", gz(t, "", []byte(secretText(66))))
	clear(v7[257:297]) // magic, version, owner and group: a V7 header
	setChecksum(v7[:512])
	if h, err := tar.NewReader(bytes.NewReader(v7)).Next(); err != nil || h.Format != tar.FormatUnknown {
		t.Fatalf("the V7 tar reads as %v (%v)", h, err)
	}
	clean := []byte("hello\n")
	lies := rawZip(t, &zip.FileHeader{Name: "a", Method: zip.Deflate, CRC32: crc32.ChecksumIEEE(clean),
		UncompressedSize64: 1, CompressedSize64: uint64(len(deflated(clean)))}, deflated(clean))
	bz := mustHex("425a6839314159265359fd064b490000164f8000106322301533d083cbf4c02000318d31184698000031ea1a01a034c9e24f26a42a4cbb79191ec2112de87e040d124f115f95b18b8dcd29cc15968df8bb9229c28487e8325a48")
	bzMember := rawZip(t, &zip.FileHeader{Name: "b", Method: 12, CRC32: crc32.ChecksumIEEE([]byte("token=" + githubToken(41) + "\n")),
		UncompressedSize64: uint64(len("token=" + githubToken(41) + "\n")), CompressedSize64: uint64(len(bz))}, bz)
	for _, tc := range []struct {
		name string
		data []byte
		rule string
		path string
	}{
		{"gzip extra field", extra.Bytes(), "secret.github-pat", "/out/x"},
		{"second gzip member", append(gz(t, "", []byte("hello\n")), gz(t, "", []byte(secretText(67)))...), "secret.github-pat", "/out/x!"},
		{"V7 tar of a gzip", v7, "secret.github-pat", "/out/x!p.gz!"},
		{"tar in gzip in zip", zipBuilt(t, 0, "t.tgz", string(gz(t, "", tarOf(t, "s", []byte(secretText(68)))))), "secret.github-pat", "/out/x!t.tgz!!s"},
		{"declared size lies", lies, RuleArchiveUnscannable, "/out/x"},
		{"bzip2 member", bzMember, "secret.github-pat", "/out/x!b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if fs := checkOut(t, Policy{}, "x", tc.data); !hasFinding(fs, tc.rule, tc.path) {
				t.Errorf("want %s on %s:%s", tc.rule, tc.path, show(fs))
			}
		})
	}
	// The members of all archives of one /out file count together.
	many := make([]string, 0, 2*6000)
	for i := range 6000 {
		many = append(many, fmt.Sprintf("m%d", i), "")
	}
	inner := string(zipBuilt(t, 0, many...))
	if fs := checkOut(t, Policy{MaxFileBytes: 64 << 20}, "many.zip", zipBuilt(t, 0, "a.zip", inner, "b.zip", inner)); !hasFinding(fs, RuleArchiveUnscannable, "/out/many.zip") {
		t.Errorf("12,000 members in two zips of a zip:%s", show(fs))
	}
}

// Bombs end in a finding quickly: members listed many times over one
// packed kernel (refused before anything is unpacked), zips of zips of
// 64 MiB of zeros and a bzip2 of a GiB (refused by the ratio).
func TestOutZipBombsAreRefused(t *testing.T) {
	kernel := deflatedZeros(t, 64<<20).Bytes()
	sum := uint32(0)
	block := make([]byte, 1<<20)
	for range 64 {
		sum = crc32.Update(sum, crc32.IEEETable, block)
	}
	one := rawZip(t, &zip.FileHeader{Name: "k0", Method: zip.Deflate, CRC32: sum, UncompressedSize64: 64 << 20, CompressedSize64: uint64(len(kernel))}, kernel)
	overlap := relist(t, one, "k0", "k1", 1000)
	nested := one
	for range MaxArchiveDepth - 1 {
		nested = zipBuilt(t, 0, "a.zip", string(nested), "b.zip", string(nested))
	}
	// A GiB of zeros by bzip2 -9: 785 bytes.
	bz := mustHex("425a68393141592653590e09e2df015f8e4000c0000008200030804d4642a025a90a80973141592653590e09e2df015f8e40" +
		"00c0000008200030804d4642a025a90a80973141592653590e09e2df015f8e4000c0000008200030804d4642a025a90a8097" +
		"3141592653590e09e2df015f8e4000c0000008200030804d4642a025a90a80973141592653590e09e2df015f8e4000c00000" +
		"08200030804d4642a025a90a80973141592653590e09e2df015f8e4000c0000008200030804d4642a025a90a809731415926" +
		"53590e09e2df015f8e4000c0000008200030804d4642a025a90a80973141592653590e09e2df015f8e4000c0000008200030" +
		"804d4642a025a90a80973141592653590e09e2df015f8e4000c0000008200030804d4642a025a90a80973141592653590e09" +
		"e2df015f8e4000c0000008200030804d4642a025a90a80973141592653590e09e2df015f8e4000c0000008200030804d4642" +
		"a025a90a80973141592653590e09e2df015f8e4000c0000008200030804d4642a025a90a80973141592653590e09e2df015f" +
		"8e4000c0000008200030804d4642a025a90a80973141592653590e09e2df015f8e4000c0000008200030804d4642a025a90a" +
		"80973141592653590e09e2df015f8e4000c0000008200030804d4642a025a90a80973141592653590e09e2df015f8e4000c0" +
		"000008200030804d4642a025a90a80973141592653590e09e2df015f8e4000c0000008200030804d4642a025a90a80973141" +
		"592653590e09e2df015f8e4000c0000008200030804d4642a025a90a80973141592653590e09e2df015f8e4000c000000820" +
		"0030804d4642a025a90a80973141592653590e09e2df015f8e4000c0000008200030804d4642a025a90a8097314159265359" +
		"0e09e2df015f8e4000c0000008200030804d4642a025a90a80973141592653590e09e2df015f8e4000c0000008200030804d" +
		"4642a025a90a80973141592653590e09e2df015f8e4000c0000008200030804d4642a025a90a8097314159265359487c5fc9" +
		"008a52c800c00000040008200030cc0529a69122436144890f177245385090f688e402")
	for _, tc := range []struct {
		name string
		data []byte
		why  string
	}{
		{"overlap.zip", overlap, "with the same data"},
		{"nested.zip", nested, "for each packed byte"},
		{"zeros.bz2", bz, "for each packed byte"},
	} {
		start := time.Now()
		fs := checkOut(t, Policy{MaxFileBytes: 1 << 30}, tc.name, tc.data)
		t.Logf("%s (%d bytes): %v", tc.name, len(tc.data), time.Since(start))
		if !hasFinding(fs, RuleArchiveUnscannable, "/out/"+tc.name) || !strings.Contains(show(fs), tc.why) {
			t.Errorf("%s: want refused, %q:%s", tc.name, tc.why, show(fs))
		}
	}
}

// Where two readers of one format read different things, the one this
// package reads could be the clean one: each such shape is refused, or
// read the way the reader that sees more reads it.
func TestOutReaderDifferentials(t *testing.T) {
	hidden := gz(t, "", []byte(secretText(69)))
	// GNU tar -i reads on past an archive's end blocks.
	ignoreZeros := append(tarOf(t, "a.txt", []byte("hello\n")), tarOf(t, "s.gz", hidden)...)

	// A symlink declaring data: GNU tar skips it, Go's reader does not,
	// and reads the header within as the next member, whose data starts
	// with junk, then GNU tar's next member.
	inner := tarOf(t, "s.gz", hidden)
	inner = inner[:len(inner)-1024] // without its end blocks
	coverHeader := tarOf(t, "cover.txt", append(bytes.Repeat([]byte("J"), 512), inner...))[:512]
	link := tarOf(t, "l", make([]byte, 1024))
	link[156] = tar.TypeSymlink
	setChecksum(link[:512])
	symlinkData := append(append(bytes.Clone(link[:512]), coverHeader...), append(bytes.Repeat([]byte("J"), 512), inner...)...)
	symlinkData = append(symlinkData, make([]byte, 1024)...)
	if h, err := tar.NewReader(bytes.NewReader(symlinkData)).Next(); err != nil || h.Typeflag != tar.TypeSymlink || h.Size != 1024 {
		t.Fatalf("the crafted tar reads as %v (%v)", h, err)
	}

	// A stored member (sizes in a data descriptor, as Go writes every
	// member) holding a descriptor of its own first bytes and then a
	// local entry: libarchive, streaming, ends the member at the first
	// and reads the second.
	one := zipBuilt(t, 0, "h", secretText(70))
	entry := one[:bytes.Index(one, []byte("PK\x01\x02"))]
	first := []byte("clean text\n")
	desc := binary.LittleEndian.AppendUint32([]byte("PK\x07\x08"), crc32.ChecksumIEEE(first))
	desc = binary.LittleEndian.AppendUint32(binary.LittleEndian.AppendUint32(desc, uint32(len(first))), uint32(len(first)))
	var sb bytes.Buffer
	zw := zip.NewWriter(&sb)
	f, _ := zw.CreateHeader(&zip.FileHeader{Name: "a.txt", Method: zip.Store})
	f.Write(append(append(bytes.Clone(first), desc...), entry...))
	zw.Close()

	// A second directory end in the comment, with a comment that does
	// not fit: Python's reader takes it, Info-ZIP's passes over it; Go's
	// refuses the zip (it takes the last signature only), and so must
	// this package.
	var cb bytes.Buffer
	zw = zip.NewWriter(&cb)
	f, _ = zw.Create("a.txt")
	f.Write([]byte("hello\n"))
	zw.SetComment("PK\x05\x06" + strings.Repeat("\x00", 16) + "\xf4\x01")
	zw.Close()

	for _, tc := range []struct {
		name string
		data []byte
		rule string
		path string
	}{
		{"tar read past its end blocks", ignoreZeros, "secret.github-pat", "/out/x!s.gz!"},
		{"tar symlink with data", symlinkData, RuleArchiveUnscannable, "/out/x"},
		{"stored member ending early for a streaming reader", sb.Bytes(), RuleArchiveUnscannable, "/out/x"},
		{"two zip directory ends", cb.Bytes(), RuleArchiveUnscannable, "/out/x"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if fs := checkOut(t, Policy{}, "x", tc.data); !hasFinding(fs, tc.rule, tc.path) {
				t.Errorf("want %s on %s:%s", tc.rule, tc.path, show(fs))
			}
		})
	}
	// Legitimate neighbours pass: a stored zip within a zip (its own
	// descriptors are not of the outer member's bytes), a tar padded
	// with zeros to its record size, a directory end alone in a comment
	// that fits.
	stored := zipBuilt(t, 0, "in.txt", "hello\n")
	var nb bytes.Buffer
	zw = zip.NewWriter(&nb)
	f, _ = zw.CreateHeader(&zip.FileHeader{Name: "in.zip", Method: zip.Store})
	f.Write(stored)
	zw.Close()
	for name, data := range map[string][]byte{
		"stored.zip": nb.Bytes(),
		"padded.tar": append(tarOf(t, "a", []byte("hi\n")), make([]byte, 8192)...),
	} {
		if fs := checkOut(t, Policy{}, name, data); len(fs) != 0 {
			t.Errorf("%s:%s", name, show(fs))
		}
	}
}

// FuzzOutArchive feeds the unpacking hostile bytes shaped like the
// archives it reads: it must end in findings or none, never a panic, an
// error (the source cannot fail here) or a hang.
func FuzzOutArchive(f *testing.F) {
	for _, seed := range [][]byte{
		zipBuilt(f, 0, "a", "hello\n", "b/c", "more\n"),
		append([]byte("#!/bin/sh\n"), zipBuilt(f, 0, "a", "x")...),
		zip64Of(f, []byte("zip64\n")),
		tarOf(f, "a", []byte("hi\n")),
		gz(f, "n", tarOf(f, "a", []byte("hi\n"))),
		append(tarOf(f, "a", []byte("hi\n")), zipBuilt(f, 0, "b", "x")...),
		mustHex("425a683931415926535900000000000000000000"),
		{0x78, 0x9c, 0x03, 0x00, 0x00, 0x00, 0x00, 0x01},
	} {
		f.Add(seed)
	}
	c := checkerAt(f, DefaultDecodeDepth)
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := c.CheckOut(context.Background(), Policy{MaxFileBytes: 1 << 20}, OutFile{Name: "f", Content: bytes.NewReader(data)}); err != nil {
			t.Fatalf("error: %v", err)
		}
	})
}
