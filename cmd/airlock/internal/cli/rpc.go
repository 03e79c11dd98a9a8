package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/airlockhq/airlock/pkg/clientconfig"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
)

// The one way a command reaches a service: withAuthority or withPublisher
// dials it as the chosen identity, runs the command's calls and closes the
// connection, turning a gRPC status into the server's message (rpcError);
// showAuthority is the common case of one call whose answer is printed.

// caller is whom a command acts as: the client config and the identity it
// presents.
type caller struct {
	cfg *clientconfig.Config
	id  identity.ID
}

// dial connects to one service as the chosen identity.
func dial(g *globals, service string) (*grpc.ClientConn, *caller, error) {
	cfg, err := g.ClientConfig()
	if err != nil {
		return nil, nil, err
	}
	src, err := cfg.Source(g.As)
	if err != nil {
		return nil, nil, err
	}
	self, err := src.ID()
	if err != nil {
		return nil, nil, err
	}
	addr, err := cfg.Address(service)
	if err != nil {
		return nil, nil, err
	}
	cc, err := grpcclient.Dial(addr, src, identity.Service(cfg.TrustDomain, service))
	return cc, &caller{cfg: cfg, id: self}, err
}

// withAuthority runs fn with a connection to the authority, as the chosen
// identity, and closes it. A gRPC status fn returns becomes a remoteError
// with the server's message; any other error is returned as it is.
func withAuthority(g *globals, fn func(authorityv1.AuthorityServiceClient, *caller) error) error {
	cc, self, err := dial(g, identity.ServiceAuthority)
	if err != nil {
		return err
	}
	defer cc.Close()
	return rpcError(fn(authorityv1.NewAuthorityServiceClient(cc), self))
}

// showAuthority makes one call to the authority and prints its answer: the
// message as JSON with -o json, else text.
func showAuthority[R proto.Message](cmd *cobra.Command, g *globals, call func(context.Context, authorityv1.AuthorityServiceClient) (R, error), text func(io.Writer, R)) error {
	return withAuthority(g, func(c authorityv1.AuthorityServiceClient, _ *caller) error {
		resp, err := call(cmd.Context(), c)
		if err != nil {
			return err
		}
		return g.PrintProto(resp, func(w io.Writer) { text(w, resp) })
	})
}

// devPipeline is the pipeline identity the dev stack issues: publish and
// deployment commands act as it when --as is not given and the client
// config's own identity is not a pipeline.
const devPipeline = "pipeline/deploy"

// devOperator is the operator identity the dev stack issues: the executor
// commands and status's fleet act as it when --as is not given and the
// client config's own identity is not an operator.
const devOperator = "operator/admin"

// defaultAs is the identity a command that acts as kind uses when --as is
// not given: the dev stack's (dev) when the client config finds its
// identities in a pki_dir (as the dev stack's does) and its own is not of
// kind, else "" (the config's own). A command given --as uses that.
func defaultAs(g *globals, kind identity.Kind, dev string) (string, error) {
	if g.As != "" {
		return g.As, nil
	}
	cfg, err := g.ClientConfig()
	if err != nil {
		return "", err
	}
	if cfg.TLS == nil && !strings.HasPrefix(cfg.Identity, string(kind)+"/") {
		return dev, nil
	}
	return "", nil
}

// withPublisher runs fn with a connection to the publisher, as a pipeline
// unless --as says otherwise, as withAuthority does with the authority.
func withPublisher(g *globals, fn func(publisherv1.PublisherServiceClient) error) error {
	as, err := defaultAs(g, identity.KindPipeline, devPipeline)
	if err != nil {
		return err
	}
	g.As = as
	cc, _, err := dial(g, identity.ServicePublisher)
	if err != nil {
		return err
	}
	defer cc.Close()
	return rpcError(fn(publisherv1.NewPublisherServiceClient(cc)))
}

// rpcError turns a status into a remoteError with the server's message;
// nil and any other error it returns as they are.
func rpcError(err error) error {
	if err == nil {
		return nil
	}
	if st, ok := status.FromError(err); ok {
		// "PermissionDenied" -> "permission denied"; servers often start
		// their message with the same words, so say them once.
		var words []string
		word := []rune{}
		for i, r := range st.Code().String() {
			if i > 0 && r >= 'A' && r <= 'Z' {
				words = append(words, string(word))
				word = word[:0]
			}
			word = append(word, r)
		}
		human := strings.ToLower(strings.Join(append(words, string(word)), " "))
		if strings.HasPrefix(st.Message(), human) {
			return remoteError{errors.New(st.Message())}
		}
		return remoteError{fmt.Errorf("%s: %s", human, st.Message())}
	}
	return err
}

// tenantFlag registers the --tenant flag of a command that takes one; what
// says what the tenant is for. Every such command resolves it with tenant.
func tenantFlag(cmd *cobra.Command, p *string, what string) {
	cmd.Flags().StringVar(p, "tenant", "", what+" (default for a client: the client config's tenant)")
}

// tenant is the tenant a command acts for, the one rule for every command
// with --tenant: the flag when given, else, for a client, the client
// config's tenant. An approver acts for no tenant, so without the flag it
// sees every tenant's.
func (c *caller) tenant(flag string) (string, error) {
	if flag != "" || c.id.Kind != identity.KindClient {
		return flag, nil
	}
	if c.cfg.Tenant == "" {
		return "", usageError{errors.New("--tenant is required (the client config names no default tenant)")}
	}
	return c.cfg.Tenant, nil
}

// allPages gathers a listing page by page: fetch gets the page token ("" for
// the first) and returns a page and the next token. It stops on the last
// page or once want items are in (want 0: all of them). A server ends its
// pages by bytes as well as by count, so one page is never the whole story.
func allPages[T any](want int, fetch func(token string, size int32) ([]T, string, error)) ([]T, error) {
	var out []T
	token := ""
	for {
		size := int32(500)
		if want > 0 {
			size = int32(min(want-len(out), 500))
		}
		page, next, err := fetch(token, size)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if next == "" || (want > 0 && len(out) >= want) {
			if want > 0 && len(out) > want {
				out = out[:want]
			}
			return out, nil
		}
		token = next
	}
}

// asOperator is g acting as an operator, which the fleet's calls need:
// --as when given, else the client config's own identity when it is an
// operator, else the dev stack's operator when the config's pki_dir holds
// its certificate, else the config's own identity (withOperator then says
// what to pass).
func asOperator(g *globals) (*globals, error) {
	as, err := defaultAs(g, identity.KindOperator, devOperator)
	if err != nil {
		return nil, err
	}
	if g.As == "" && as == devOperator {
		cfg, err := g.ClientConfig()
		if err != nil {
			return nil, err
		}
		if _, err := cfg.Source(devOperator); err != nil {
			as = ""
		}
	}
	op := *g
	op.As = as
	return &op, nil
}

// withOperator runs fn with a connection to the authority as an operator
// (asOperator), as withAuthority does; as any other identity it makes no
// call and says how to act as one.
func withOperator(g *globals, fn func(authorityv1.AuthorityServiceClient) error) error {
	op, err := asOperator(g)
	if err != nil {
		return err
	}
	return withAuthority(op, func(client authorityv1.AuthorityServiceClient, self *caller) error {
		if self.id.Kind != identity.KindOperator {
			return needOperator(self.id)
		}
		return fn(client)
	})
}

// needOperator says that the fleet is an operator's to see and drain, and
// how to act as one.
func needOperator(self identity.ID) error {
	return usageError{fmt.Errorf("the fleet needs an operator identity, and this is %s: pass --as operator/NAME (airlock pki issue --dir DIR --id operator/NAME issues one)", self.Principal())}
}
