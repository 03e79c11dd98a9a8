package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/airlockhq/airlock/cmd/airlock/internal/cmdutil"
	"github.com/airlockhq/airlock/pkg/clientconfig"
	"github.com/airlockhq/airlock/pkg/grpcclient"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/termtext"
	"github.com/airlockhq/airlock/pkg/tlsconfig"
	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// serviceHealth is one service's health as seen over mTLS.
type serviceHealth struct {
	Service  string            `json:"service"`
	Address  string            `json:"address"`
	Status   string            `json:"status"`
	Error    string            `json:"error,omitempty"`
	Runtimes map[string]string `json:"runtimes,omitempty"`
	// RuntimeNotes say more of a class where the executor reports it:
	// for runsc, gVisor's platform and the self-check's outcome, from its
	// health components "runtime/runsc/platform/P" and
	// "runtime/runsc/self-check"; for vm, "emulated" from
	// "runtime/vm/emulated" (QEMU's TCG, not KVM).
	RuntimeNotes map[string]string `json:"runtime_notes,omitempty"`
	// Cgroups is the executor's cgroup mode and the controllers its jobs
	// use, from its health components "cgroup/MODE" and
	// "cgroup/MODE/CONTROLLER".
	Cgroups *cgroupUse `json:"cgroups,omitempty"`
}

type cgroupUse struct {
	Mode        string   `json:"mode"`
	Controllers []string `json:"controllers"`
}

// runtimeClasses are the executor's runtime classes, reported as health
// components "runtime/CLASS".
var runtimeClasses = []string{"runc", "runsc", "vm"}

func newStatus(g *globals) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show each service's health, checked over mTLS, and the fleet's executors (as an operator)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.ClientConfig()
			if err != nil {
				return err
			}
			src, err := cfg.Source(g.As)
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), timeout)
			defer cancel()
			report := checkAll(ctx, cfg, src)
			out := map[string]any{"services": report}
			cache := imageCacheOf(ctx, g, report)
			if cache != nil {
				out["image_cache"] = cache
			}
			fleet, fleetNote := fleetOf(ctx, g, report)
			if fleet != nil {
				data, err := protojson.Marshal(fleet)
				if err != nil {
					return err
				}
				out["fleet"] = json.RawMessage(data)
			} else {
				out["fleet_note"] = fleetNote
			}
			if err := g.Print(out, func(w io.Writer) {
				fmt.Fprintln(w, "SERVICE\tADDRESS\tSTATUS\tERROR")
				for _, h := range report {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", serviceLabel(h.Service), termtext.Line(h.Address), termtext.Line(h.Status), termtext.Line(h.Error))
				}
				for _, h := range report {
					for _, c := range runtimeClasses {
						if st, ok := h.Runtimes[c]; ok {
							fmt.Fprintf(w, "%s runtime %s\t\t%s\t%s\n", h.Service, c, termtext.Line(st), termtext.Line(h.RuntimeNotes[c]))
						}
					}
					if h.Cgroups != nil {
						fmt.Fprintf(w, "%s cgroup %s\t\t%s\t\n", h.Service, termtext.Line(h.Cgroups.Mode), termtext.Line(strings.Join(h.Cgroups.Controllers, " ")))
					}
				}
				if cache != nil {
					writeImageCache(w, cache)
				}
				if fleet == nil {
					fmt.Fprintf(w, "\nfleet: %s\n", termtext.Line(fleetNote))
					return
				}
				fmt.Fprintf(w, "\nfleet: %s\n", fleetSummary(fleet.GetExecutors()))
				if len(fleet.GetExecutors()) > 0 {
					writeExecutorTable(w, fleet.GetExecutors(), time.Now())
				}
			}); err != nil {
				return err
			}
			for _, h := range report {
				if h.Status != healthpb.HealthCheckResponse_SERVING.String() {
					return &exitError{code: 1, err: fmt.Errorf("%s is %s", h.Service, h.Status)}
				}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 5*time.Second, "how long to wait for all answers")
	return cmd
}

// serviceLabel names a service in status's table: the executor checked
// is the one the client config names, which in a fleet is one of many
// (the fleet's lines show them all).
func serviceLabel(service string) string {
	if service == identity.ServiceExecutor {
		return service + " (client config)"
	}
	return service
}

// fleetOf is the fleet as the authority lists it to an operator
// (asOperator), or, when that cannot be read, a note saying why: the
// caller is no operator, the authority is not serving, or its error.
func fleetOf(ctx context.Context, g *globals, report []serviceHealth) (*authorityv1.ListExecutorsResponse, string) {
	for _, h := range report {
		if h.Service == identity.ServiceAuthority && h.Status != healthpb.HealthCheckResponse_SERVING.String() {
			return nil, "not shown: the authority is not serving"
		}
	}
	op, err := asOperator(g)
	if err != nil {
		return nil, "not shown: " + err.Error()
	}
	var out *authorityv1.ListExecutorsResponse
	note := ""
	err = withAuthority(op, func(client authorityv1.AuthorityServiceClient, self *caller) error {
		if self.id.Kind != identity.KindOperator {
			note = "not shown: it needs an operator identity (--as operator/NAME), and this is " + self.id.Principal()
			return nil
		}
		resp, err := client.ListExecutors(ctx, &authorityv1.ListExecutorsRequest{})
		out = resp
		return err
	})
	if err != nil {
		return nil, "not shown: " + err.Error()
	}
	return out, note
}

// checkAll asks every configured service for its health, concurrently.
// The executor is left out when the client config names none: the
// authority's fleet is where executors are found.
func checkAll(ctx context.Context, cfg *clientconfig.Config, src *tlsconfig.Source) []serviceHealth {
	var names []string
	for _, name := range identity.ServiceNames() {
		if _, err := cfg.Address(name); err == nil || name != identity.ServiceExecutor {
			names = append(names, name)
		}
	}
	out := make([]serviceHealth, len(names))
	done := make(chan struct{}, len(names))
	for i, name := range names {
		go func() {
			defer func() { done <- struct{}{} }()
			h := serviceHealth{Service: name, Status: "UNKNOWN"}
			addr, err := cfg.Address(name)
			if err != nil {
				h.Error = err.Error()
				out[i] = h
				return
			}
			h.Address = addr
			h.Status, err = cmdutil.CheckHealth(ctx, addr, src, identity.Service(cfg.TrustDomain, name), "")
			if err != nil {
				h.Error = err.Error()
			}
			if name == identity.ServiceExecutor && err == nil {
				h.Runtimes = map[string]string{}
				for _, c := range runtimeClasses {
					if st, err := cmdutil.CheckHealth(ctx, addr, src, identity.Service(cfg.TrustDomain, name), "runtime/"+c); err == nil {
						h.Runtimes[c] = st
					} else if status.Code(err) == codes.NotFound {
						h.Runtimes[c] = "NOT_CONFIGURED"
					}
				}
				comps := components(ctx, addr, src, identity.Service(cfg.TrustDomain, name))
				h.Cgroups = cgroupUseOf(comps)
				h.RuntimeNotes = runtimeNotes(comps)
			}
			out[i] = h
		}()
	}
	for range names {
		<-done
	}
	return out
}

// components lists a server's health components and their statuses; nil
// when it cannot (an older executor).
func components(ctx context.Context, addr string, src *tlsconfig.Source, server identity.ID) map[string]healthpb.HealthCheckResponse_ServingStatus {
	cc, err := grpcclient.Dial(addr, src, server)
	if err != nil {
		return nil
	}
	defer cc.Close()
	resp, err := healthpb.NewHealthClient(cc).List(ctx, &healthpb.HealthListRequest{})
	if err != nil {
		return nil
	}
	out := map[string]healthpb.HealthCheckResponse_ServingStatus{}
	for name, st := range resp.GetStatuses() {
		out[name] = st.GetStatus()
	}
	return out
}

// runtimeNotes says, per runtime class, what the executor's components
// below "runtime/CLASS/" report: gVisor's platform, whether runsc passed
// its self-check, and whether the VM class is emulated.
func runtimeNotes(comps map[string]healthpb.HealthCheckResponse_ServingStatus) map[string]string {
	notes := map[string]string{}
	for _, c := range runtimeClasses {
		var parts []string
		_, cached := comps["runtime/"+c+"/self-check/cached"]
		for name, st := range comps {
			rest, ok := strings.CutPrefix(name, "runtime/"+c+"/")
			if !ok {
				continue
			}
			if p, ok := strings.CutPrefix(rest, "platform/"); ok {
				parts = append(parts, "platform "+p)
			} else if rest == "emulated" {
				parts = append(parts, "vm: emulated (QEMU's TCG, no KVM: for development and CI only)")
			} else if rest == "self-check" {
				note := map[bool]string{true: "self-check passed", false: "self-check FAILED: refused (see the executor's log)"}[st == healthpb.HealthCheckResponse_SERVING]
				if cached && st == healthpb.HealthCheckResponse_SERVING {
					note += " (cached from an earlier start)"
				}
				parts = append(parts, note)
			}
		}
		if len(parts) > 0 {
			sort.Strings(parts)
			notes[c] = strings.Join(parts, ", ")
		}
	}
	if len(notes) == 0 {
		return nil
	}
	return notes
}

// cgroupUseOf reads the executor's cgroup mode and controllers from its
// health components; nil when it reports none (an older executor).
func cgroupUseOf(comps map[string]healthpb.HealthCheckResponse_ServingStatus) *cgroupUse {
	var use cgroupUse
	for name := range comps {
		rest, ok := strings.CutPrefix(name, "cgroup/")
		if !ok {
			continue
		}
		if mode, ctl, ok := strings.Cut(rest, "/"); ok {
			use.Mode = mode
			use.Controllers = append(use.Controllers, ctl)
		} else {
			use.Mode = rest
		}
	}
	if use.Mode == "" {
		return nil
	}
	sort.Strings(use.Controllers)
	return &use
}

// imageCacheOf is the executor's image cache as the authority reports it
// to a client of a tenant (airlock image list shows the tenant's images in
// it); nil for another caller, or when the authority or the executor is
// not serving.
func imageCacheOf(ctx context.Context, g *globals, report []serviceHealth) *typesv1.ImageCacheStats {
	for _, h := range report {
		if h.Status != healthpb.HealthCheckResponse_SERVING.String() {
			return nil
		}
	}
	var out *typesv1.ImageCacheStats
	_ = withAuthority(g, func(client authorityv1.AuthorityServiceClient, self *caller) error {
		tenant, err := self.tenant("")
		if err != nil || tenant == "" {
			return err
		}
		resp, err := client.ListImages(ctx, &authorityv1.ListImagesRequest{Tenant: tenant})
		if err == nil {
			out = resp.GetCache()
		}
		return err
	})
	return out
}
