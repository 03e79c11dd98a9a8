package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

func (f *fakeAuthority) DownloadBundle(_ *authorityv1.DownloadBundleRequest, stream grpc.ServerStreamingServer[authorityv1.DownloadBundleResponse]) error {
	for _, m := range f.download {
		if err := stream.Send(m); err != nil {
			return err
		}
	}
	return f.downloadErr
}

// downloadStream is what an authority sends for a bundle of digest whose
// bytes are chunks, confirmed as verified (the last message) unless
// verified is "".
func downloadStream(digest, verified string, chunks ...string) []*authorityv1.DownloadBundleResponse {
	msgs := []*authorityv1.DownloadBundleResponse{{Msg: &authorityv1.DownloadBundleResponse_Header{Header: &authorityv1.BundleHeader{
		JobId: "j-1", BundleDigest: digest, Provenance: []byte(`{"payloadType":"application/vnd.in-toto+json"}`),
	}}}}
	for _, c := range chunks {
		msgs = append(msgs, &authorityv1.DownloadBundleResponse{Msg: &authorityv1.DownloadBundleResponse_Chunk{Chunk: []byte(c)}})
	}
	if verified != "" {
		msgs = append(msgs, &authorityv1.DownloadBundleResponse{Msg: &authorityv1.DownloadBundleResponse_VerifiedDigest{VerifiedDigest: verified}})
	}
	return msgs
}

// TestJobDownload: the bundle and its envelope are written once every
// byte had the digest the header names and the authority confirmed it.
// From the attacker's side, an authority (or an executor behind it) that
// sends other bytes, confirms another digest, stops early, sends bytes
// after its confirmation or fails mid-stream gets nothing written: no
// file of its own, and an earlier download left as it was.
func TestJobDownload(t *testing.T) {
	const body = "the bundle's bytes"
	sum := sha256.Sum256([]byte(body))
	digest := "sha256:" + hex.EncodeToString(sum[:])
	good := downloadStream(digest, digest, body[:5], body[5:])

	dir := filepath.Join(t.TempDir(), "audit")
	cfg := serveFake(t, &fakeAuthority{download: good})
	code, out, errOut := runCLI(t, cfg, nil, "job", "download", "j-1", "--out", dir)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "bundle.tar")); err != nil || string(got) != body {
		t.Fatalf("bundle.tar = %q, %v", got, err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "provenance.json")); err != nil || !strings.Contains(string(got), "in-toto") {
		t.Fatalf("provenance.json = %q, %v", got, err)
	}
	if !strings.Contains(out, digest+", 18B, verified") {
		t.Errorf("output:\n%s", out)
	}

	other := downloadStream(digest, digest, "other bytes")
	for name, f := range map[string]*fakeAuthority{
		"other bytes":            {download: other},
		"another digest":         {download: downloadStream(digest, "sha256:"+strings.Repeat("0", 64), body)},
		"no confirmation":        {download: downloadStream(digest, "", body)},
		"bytes after it":         {download: append(downloadStream(digest, digest, body), downloadStream(digest, "", "more")[1])},
		"a failure mid-stream":   {download: downloadStream(digest, "", body[:5]), downloadErr: status.Error(codes.DataLoss, "the bundle is not the one recorded")},
		"a digest that is not":   {download: downloadStream("sha256:../x", "sha256:../x", body)},
		"no header":              {download: good[1:]},
		"two headers":            {download: append(downloadStream(digest, "", body[:5]), good...)},
		"an empty stream, ended": {},
	} {
		t.Run(name, func(t *testing.T) {
			cfg := serveFake(t, f)
			fresh := t.TempDir()
			if code, _, errOut := runCLI(t, cfg, nil, "job", "download", "j-1", "--out", fresh); code != 1 {
				t.Errorf("fresh directory: exit %d (%s), want 1", code, errOut)
			} else {
				t.Logf("refused: %s", strings.TrimSpace(errOut))
			}
			if entries, _ := os.ReadDir(fresh); len(entries) != 0 {
				t.Errorf("left behind: %v", entries)
			}
			if code, _, _ := runCLI(t, cfg, nil, "job", "download", "j-1", "--out", dir); code != 1 {
				t.Errorf("over the earlier download: exit %d, want 1", code)
			}
			if got, err := os.ReadFile(filepath.Join(dir, "bundle.tar")); err != nil || string(got) != body {
				t.Errorf("the earlier bundle.tar is now %q, %v", got, err)
			}
			if entries, _ := os.ReadDir(dir); len(entries) != 2 {
				t.Errorf("the earlier download's directory holds %v", entries)
			}
		})
	}
}
