// Package executorclient is the publisher's client of the executor: it
// adapts the executor's gRPC API to what the publish domain asks of it
// (publish.Executor), downloading a bundle and converting errors. Only the
// publisher's composition root imports it.
package executorclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"google.golang.org/grpc"

	"github.com/airlockhq/airlock/pkg/errdefs"
	"github.com/airlockhq/airlock/pkg/errgrpc"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
)

// artifactTimeout bounds a bundle's download.
const artifactTimeout = 30 * time.Minute

// Client is publish.Executor over the executor's API.
type Client struct {
	c executorv1.ExecutorServiceClient
}

// New returns the executor adapter.
func New(cc grpc.ClientConnInterface) *Client {
	return &Client{c: executorv1.NewExecutorServiceClient(cc)}
}

// Artifact implements publish.Executor.
func (e *Client) Artifact(ctx context.Context, jobID, digest string, w io.Writer) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, artifactTimeout)
	defer cancel()
	stream, err := e.c.GetArtifact(ctx, &executorv1.GetArtifactRequest{JobId: jobID, BundleDigest: digest})
	if err != nil {
		return nil, errgrpc.FromPeer("executor", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, errgrpc.FromPeer("executor", err)
	}
	h := first.GetHeader()
	if h == nil {
		return nil, errors.New("executorclient: GetArtifact did not start with a header")
	}
	var got int64
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			if got != h.GetSize() {
				return nil, fmt.Errorf("%w: executor: GetArtifact sent %d bytes of a %d-byte bundle", errdefs.ErrUnavailable, got, h.GetSize())
			}
			return h.GetProvenance(), nil
		}
		if err != nil {
			return nil, errgrpc.FromPeer("executor", err)
		}
		if msg.GetHeader() != nil {
			return nil, errors.New("executorclient: GetArtifact sent a second header")
		}
		if got += int64(len(msg.GetChunk())); got > h.GetSize() {
			return nil, fmt.Errorf("%w: executor: GetArtifact sent more than the %d bytes its header announced", errdefs.ErrUnavailable, h.GetSize())
		}
		if _, err := w.Write(msg.GetChunk()); err != nil {
			return nil, err
		}
	}
}
