package cli

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/airlockhq/airlock/pkg/atomicfile"
	"github.com/airlockhq/airlock/pkg/bundle"
	"github.com/airlockhq/airlock/pkg/chunkio"
	"github.com/airlockhq/airlock/pkg/digest"
	"github.com/airlockhq/airlock/pkg/termtext"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
)

// The files job download writes in its directory.
const (
	bundleFileName     = "bundle.tar"
	provenanceFileName = "provenance.json"
)

// downloaded is what job download prints.
type downloaded struct {
	JobID      string `json:"job_id"`
	Digest     string `json:"bundle_digest"`
	Size       int64  `json:"size"`
	Bundle     string `json:"bundle"`
	Provenance string `json:"provenance"`
}

func newJobDownload(g *globals) *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "download JOB_ID [--out DIR]",
		Short: "Write a finished job's result bundle and its signed provenance, verified by digest, for an audit",
		Long: `Writes a finished job's (or session's) whole result bundle to DIR/bundle.tar
and the provenance envelope the executor signed over it to
DIR/provenance.json: a DSSE envelope of an in-toto statement whose subject
is the bundle's sha256, signed with the executor's key, its certificate
chain beside the signature.

The bundle is streamed through the authority from the executor, and every
byte is checked against the digest the authority recorded for the job's
result, by the authority and again here. Both files are written beside
their names and renamed only once the whole bundle matched: a mismatch or
a broken stream leaves nothing behind, and no earlier file is replaced.

A client of the job's tenant may download it, and so may an approver the
tenant's approval policy lists (--as approver/NAME). docs/auditing.md says
how to verify the two files offline with standard tools.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withAuthority(g, func(client authorityv1.AuthorityServiceClient, _ *caller) error {
				stream, err := client.DownloadBundle(cmd.Context(), &authorityv1.DownloadBundleRequest{JobId: args[0]})
				if err != nil {
					return err
				}
				d, err := writeBundle(stream, dir)
				if err != nil {
					return err
				}
				return g.Print(d, func(w io.Writer) {
					fmt.Fprintf(w, "job\t%s\n", termtext.Line(d.JobID))
					fmt.Fprintf(w, "bundle\t%s (%s, %s, verified)\n", termtext.Line(d.Bundle), d.Digest, humanBytes(d.Size))
					fmt.Fprintf(w, "provenance\t%s\n", termtext.Line(d.Provenance))
				})
			})
		},
	}
	cmd.Flags().StringVar(&dir, "out", ".", "the directory to write bundle.tar and provenance.json in (made if missing)")
	return cmd
}

// bundleStream is a DownloadBundle stream read as a bundle: its header,
// then the bundle's bytes from chunks, then end's checks that the
// authority confirmed the header's digest and sent nothing after it.
type bundleStream struct {
	stream interface {
		Recv() (*authorityv1.DownloadBundleResponse, error)
	}
	header   *authorityv1.BundleHeader
	chunks   io.Reader
	verified string
}

// openBundle reads a DownloadBundle stream's header.
func openBundle(stream interface {
	Recv() (*authorityv1.DownloadBundleResponse, error)
}) (*bundleStream, error) {
	first, err := stream.Recv()
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	h := first.GetHeader()
	if h == nil {
		return nil, remoteError{errors.New("the authority's DownloadBundle began without its header")}
	}
	if !digest.Valid(h.GetBundleDigest()) {
		return nil, remoteError{fmt.Errorf("the authority named bundle digest %q, not sha256:<64 hex>", h.GetBundleDigest())}
	}
	b := &bundleStream{stream: stream, header: h}
	b.chunks = chunkio.NewReader(func() ([]byte, error) {
		msg, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = remoteError{errors.New("the stream of the bundle ended before the authority confirmed its digest")}
			}
			return nil, err
		}
		switch m := msg.GetMsg().(type) {
		case *authorityv1.DownloadBundleResponse_Chunk:
			if b.verified != "" {
				return nil, remoteError{errors.New("the authority sent bytes after confirming the bundle's digest")}
			}
			return m.Chunk, nil
		case *authorityv1.DownloadBundleResponse_VerifiedDigest:
			b.verified = m.VerifiedDigest
			return nil, io.EOF
		}
		return nil, remoteError{errors.New("the authority sent a second header")}
	})
	return b, nil
}

// end checks, once chunks is read to its end, that the authority
// confirmed the header's digest and the stream ends there.
func (b *bundleStream) end() error {
	if b.verified != b.header.GetBundleDigest() {
		return remoteError{fmt.Errorf("the authority confirmed digest %q, not the %s it named", b.verified, b.header.GetBundleDigest())}
	}
	// Anything after the confirmation is not part of what was verified.
	if _, err := b.stream.Recv(); !errors.Is(err, io.EOF) {
		return remoteError{errors.New("the stream went on after the authority confirmed the digest")}
	}
	return nil
}

// writeBundle writes a DownloadBundle stream's bundle and envelope into
// dir, both or neither: only once every byte had the header's digest and
// the authority confirmed it.
func writeBundle(stream interface {
	Recv() (*authorityv1.DownloadBundleResponse, error)
}, dir string) (*downloaded, error) {
	b, err := openBundle(stream)
	if err != nil {
		return nil, err
	}
	h := b.header
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	d := &downloaded{JobID: h.GetJobId(), Digest: h.GetBundleDigest(),
		Bundle: filepath.Join(dir, bundleFileName), Provenance: filepath.Join(dir, provenanceFileName)}
	tar, err := atomicfile.Create(d.Bundle, 0o644)
	if err != nil {
		return nil, err
	}
	defer tar.Abort()
	env, err := atomicfile.Create(d.Provenance, 0o644)
	if err != nil {
		return nil, err
	}
	defer env.Abort()
	if _, err := env.Write(h.GetProvenance()); err != nil {
		return nil, err
	}
	if d.Size, err = bundle.Copy(tar, b.chunks, d.Digest); err != nil {
		if errors.Is(err, bundle.ErrDigestMismatch) {
			return nil, remoteError{fmt.Errorf("job %s: %v; nothing was written", d.JobID, err)}
		}
		return nil, fmt.Errorf("%w; nothing was written", rpcError(err))
	}
	if err := b.end(); err != nil {
		return nil, fmt.Errorf("%w; nothing was written", err)
	}
	if err := env.Commit(atomicfile.Durable); err != nil {
		return nil, err
	}
	if err := tar.Commit(atomicfile.Durable); err != nil {
		return nil, err
	}
	return d, nil
}
