package api

import (
	"google.golang.org/grpc"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	"github.com/airlockhq/airlock/services/authority/internal/approvals"
)

func (s *Service) DownloadBundle(req *authorityv1.DownloadBundleRequest, stream grpc.ServerStreamingServer[authorityv1.DownloadBundleResponse]) error {
	ctx := stream.Context()
	id, err := caller(ctx)
	if err != nil {
		return err
	}
	digest, err := s.cfg.Approvals.DownloadBundle(ctx, id, req.GetJobId(), bundleSink{stream})
	if err != nil {
		return s.fail(ctx, err)
	}
	return stream.Send(&authorityv1.DownloadBundleResponse{Msg: &authorityv1.DownloadBundleResponse_VerifiedDigest{VerifiedDigest: digest}})
}

// bundleSink sends what approvals.DownloadBundle reads as DownloadBundle
// messages.
type bundleSink struct {
	stream grpc.ServerStreamingServer[authorityv1.DownloadBundleResponse]
}

func (k bundleSink) Header(b approvals.Bundle) error {
	return k.stream.Send(&authorityv1.DownloadBundleResponse{Msg: &authorityv1.DownloadBundleResponse_Header{Header: &authorityv1.BundleHeader{
		JobId: b.JobID, BundleDigest: b.Digest, Provenance: b.Provenance,
	}}})
}

func (k bundleSink) Chunk(data []byte) error {
	return k.stream.Send(&authorityv1.DownloadBundleResponse{Msg: &authorityv1.DownloadBundleResponse_Chunk{Chunk: data}})
}
