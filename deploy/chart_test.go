package deploy

import (
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

var parts = []string{"authority", "publisher", "executor"}

// executorSecurityContext is the executor container's securityContext as
// the chart's comments justify it field by field; any change to it must
// change this and those comments together.
var executorSecurityContext = corev1.SecurityContext{
	Privileged:               ptr(true),
	RunAsUser:                ptr(int64(0)),
	RunAsNonRoot:             ptr(false),
	AllowPrivilegeEscalation: ptr(true),
	SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeUnconfined},
	AppArmorProfile:          &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined},
	ReadOnlyRootFilesystem:   ptr(false),
}

func ptr[T any](v T) *T { return &v }

// The variants every property test runs on.
var variants = []struct {
	name   string
	values map[string]any
}{
	{"defaults", nil},
	{"cert-manager-csi", set("identity.provider", "cert-manager-csi", "identity.certManager.executorNamedByPod", true)},
	{"replicas and clients", set("authority.replicas", 3, "publisher.replicas", 1,
		"networkPolicy.clientsFrom", []any{map[string]any{"ipBlock": map[string]any{"cidr": "192.0.2.0/24"}}},
		"authority.checkpointKeySecret", "airlock-checkpoint-key", "authority.credentialsSecret", "airlock-credentials")},
	{"no metrics", set("telemetry.prometheusPort", map[string]any{"authority": 0, "publisher": 0, "executor": 0})},
}

func TestChartRendersEveryPart(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			r := render(t, v.values)
			for _, want := range []struct {
				kind string
				got  []string
				want []string
			}{
				{"Deployment", keys(r.deployments), []string{name("authority"), name("publisher")}},
				{"DaemonSet", keys(r.daemonSets), []string{name("executor")}},
				{"Service", keys(r.services), []string{name("authority"), name("executor"), name("publisher")}},
				{"ServiceAccount", keys(r.serviceAccounts), []string{name("authority"), name("executor"), name("publisher")}},
				{"PodDisruptionBudget", keys(r.pdbs), []string{name("authority"), name("publisher")}},
				{"NetworkPolicy", keys(r.netpols), []string{name("authority"), name("default-deny"), name("executor"), name("publisher")}},
			} {
				if !slices.Equal(want.got, want.want) {
					t.Errorf("%s objects %v, want %v", want.kind, want.got, want.want)
				}
			}
		})
	}
}

func TestExecutorDaemonSet(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			ds := render(t, v.values).daemonSets[name("executor")]
			spec := ds.Spec.Template.Spec
			if want := map[string]string{"airlock.dev/executor": "true"}; !reflect.DeepEqual(spec.NodeSelector, want) {
				t.Errorf("nodeSelector %v, want %v", spec.NodeSelector, want)
			}
			if !slices.ContainsFunc(spec.Tolerations, func(tl corev1.Toleration) bool {
				return tl.Key == "airlock.dev/executor" && tl.Effect == corev1.TaintEffectNoSchedule
			}) {
				t.Errorf("tolerations %v lack the pool's taint", spec.Tolerations)
			}
			if spec.HostNetwork || spec.HostPID || spec.HostIPC {
				t.Errorf("hostNetwork %v, hostPID %v, hostIPC %v: want none", spec.HostNetwork, spec.HostPID, spec.HostIPC)
			}
			if ds.Spec.UpdateStrategy.Type != appsv1.OnDeleteDaemonSetStrategyType {
				t.Errorf("updateStrategy %q, want OnDelete (drain, then replace)", ds.Spec.UpdateStrategy.Type)
			}
			c := container(t, spec, "executor")
			if !reflect.DeepEqual(*c.SecurityContext, executorSecurityContext) {
				t.Errorf("executor securityContext\n%+v\nwant\n%+v", *c.SecurityContext, executorSecurityContext)
			}
			if _, ok := c.Resources.Limits[corev1.ResourceMemory]; ok {
				t.Errorf("a memory limit on the executor bounds every job together: %v", c.Resources.Limits)
			}
			args := strings.Join(c.Args, " ")
			if !strings.Contains(args, "--advertise $(POD_IP):7402") {
				t.Errorf("args %q lack --advertise $(POD_IP):7402", args)
			}
			if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
				return e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP"
			}) {
				t.Errorf("env %v lacks POD_IP from status.podIP", c.Env)
			}
			data := volume(t, spec, "data")
			if data.HostPath == nil || data.HostPath.Path != "/var/lib/airlock/executor" {
				t.Errorf("data volume %+v, want the node's /var/lib/airlock/executor", data.VolumeSource)
			}
			m := mount(t, c, "data")
			if m.MountPropagation == nil || *m.MountPropagation != corev1.MountPropagationBidirectional {
				t.Errorf("data mount propagation %v, want Bidirectional", m.MountPropagation)
			}
			for _, vol := range spec.Volumes {
				if vol.HostPath != nil && vol.Name != "data" {
					t.Errorf("host path %s mounted (volume %s): only the data directory is the node's", vol.HostPath.Path, vol.Name)
				}
			}
		})
	}
}

func TestPodsHoldNoKubernetesToken(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			r := render(t, v.values)
			for _, sa := range r.serviceAccounts {
				if sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
					t.Errorf("ServiceAccount %s mounts its token", sa.Name)
				}
			}
			for n, spec := range podSpecs(r) {
				if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
					t.Errorf("%s mounts a Kubernetes API token", n)
				}
				if _, ok := r.serviceAccounts[spec.ServiceAccountName]; !ok {
					t.Errorf("%s runs as ServiceAccount %q, which the chart does not make", n, spec.ServiceAccountName)
				}
				for _, vol := range spec.Volumes {
					if vol.Projected != nil {
						t.Errorf("%s: projected volume %s (a token?)", n, vol.Name)
					}
				}
			}
		})
	}
}

func TestAuthorityAndPublisherRunUnprivileged(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			r := render(t, v.values)
			for _, part := range []string{"authority", "publisher"} {
				spec := r.deployments[name(part)].Spec.Template.Spec
				psc := spec.SecurityContext
				if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 ||
					psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
					t.Errorf("%s pod securityContext %+v: want non-root and seccomp RuntimeDefault", part, psc)
				}
				if spec.HostNetwork || spec.HostPID || spec.HostIPC {
					t.Errorf("%s uses a host namespace", part)
				}
				for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
					sc := c.SecurityContext
					if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
						sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation ||
						sc.Privileged != nil && *sc.Privileged ||
						sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
						t.Errorf("%s container %s securityContext %+v: want read-only root, no escalation, ALL dropped", part, c.Name, sc)
					}
				}
				for _, vol := range spec.Volumes {
					if vol.HostPath != nil {
						t.Errorf("%s mounts host path %s", part, vol.HostPath.Path)
					}
				}
				c := container(t, spec, part)
				for _, p := range []*corev1.Probe{c.StartupProbe, c.ReadinessProbe, c.LivenessProbe} {
					if p == nil || p.TCPSocket == nil || p.TCPSocket.Port != intstr.FromString("grpc") {
						t.Errorf("%s probe %+v, want a tcpSocket probe of grpc", part, p)
					}
				}
			}
		})
	}
}

func TestReplicasAndDisruptionBudgets(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			r := render(t, v.values)
			wantAuthority := int32(2)
			if v.values != nil && v.values["authority"] != nil {
				if n, ok := v.values["authority"].(map[string]any)["replicas"].(int); ok {
					wantAuthority = int32(n)
				}
			}
			if got := *r.deployments[name("authority")].Spec.Replicas; got != wantAuthority {
				t.Errorf("authority replicas %d, want %d", got, wantAuthority)
			}
			for n, d := range r.deployments {
				podLabels := labels.Set(d.Spec.Template.Labels)
				var covered []string
				for _, pdb := range r.pdbs {
					sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
					if err != nil {
						t.Fatal(err)
					}
					if sel.Matches(podLabels) {
						covered = append(covered, pdb.Name)
					}
				}
				if len(covered) != 1 {
					t.Errorf("Deployment %s is covered by PDBs %v, want exactly one", n, covered)
				}
			}
		})
	}
}

func TestNetworkPolicies(t *testing.T) {
	r := render(t, nil)
	pods := map[string]labels.Set{}
	for _, part := range parts {
		pods[part] = labels.Set(podTemplate(r, part).Labels)
	}
	policiesOf := func(part string) []*networkingv1.NetworkPolicy {
		var out []*networkingv1.NetworkPolicy
		for _, np := range r.netpols {
			sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
			if err != nil {
				t.Fatal(err)
			}
			if sel.Matches(pods[part]) {
				out = append(out, np)
			}
		}
		return out
	}
	// allows says whether some policy of part lets traffic from (ingress)
	// or to (egress) the pods of peer on port.
	allows := func(part string, egress bool, peer string, port int) bool {
		for _, np := range policiesOf(part) {
			if egress {
				for _, rule := range np.Spec.Egress {
					if portIn(rule.Ports, port) && peerIn(t, rule.To, pods[peer]) {
						return true
					}
				}
				continue
			}
			for _, rule := range np.Spec.Ingress {
				if portIn(rule.Ports, port) && peerIn(t, rule.From, pods[peer]) {
					return true
				}
			}
		}
		return false
	}
	for _, part := range parts {
		ps := policiesOf(part)
		if len(ps) != 2 {
			t.Errorf("%s is selected by %d policies, want the default deny and its own", part, len(ps))
		}
		for _, np := range ps {
			if !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}) {
				t.Errorf("policy %s types %v, want Ingress and Egress", np.Name, np.Spec.PolicyTypes)
			}
		}
	}
	for _, c := range []struct {
		from, to string
		port     int
		want     bool
	}{
		{"executor", "authority", 7401, true},
		{"publisher", "authority", 7401, true},
		{"authority", "executor", 7402, true},
		{"publisher", "executor", 7402, true},
		{"executor", "publisher", 7403, false},
		{"authority", "publisher", 7403, false}, // the publisher lets anyone in, the authority never calls it
		{"executor", "executor", 7402, false},
	} {
		got := allows(c.from, true, c.to, c.port) && allows(c.to, false, c.from, c.port)
		if got != c.want {
			t.Errorf("%s -> %s:%d allowed %v, want %v", c.from, c.to, c.port, got, c.want)
		}
	}
	// Jobs leave through the executor pod: everything but the cluster's
	// networks, which the executor's config denies to jobs too.
	exe := r.netpols[name("executor")]
	var jobRule *networkingv1.NetworkPolicyEgressRule
	for i, rule := range exe.Spec.Egress {
		if len(rule.To) == 1 && rule.To[0].IPBlock != nil && rule.To[0].IPBlock.CIDR == "0.0.0.0/0" {
			jobRule = &exe.Spec.Egress[i]
		}
	}
	alwaysDeny := serviceConfig(t, r, "executor")["network"].(map[string]any)["always_deny"]
	switch {
	case jobRule == nil:
		t.Errorf("no job egress rule in %s", exe.Name)
	case !reflect.DeepEqual(toAny(jobRule.To[0].IPBlock.Except), alwaysDeny):
		t.Errorf("job egress excepts %v, executor network.always_deny is %v: want the same cluster CIDRs", jobRule.To[0].IPBlock.Except, alwaysDeny)
	}
	for _, part := range []string{"authority", "publisher"} {
		found := false
		for _, rule := range r.netpols[name(part)].Spec.Egress {
			if portIn(rule.Ports, 5432) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s may not reach PostgreSQL", part)
		}
	}
	if off := render(t, set("networkPolicy.enabled", false)); len(off.netpols) != 0 {
		t.Errorf("networkPolicy.enabled false still renders %v", keys(off.netpols))
	}
}

func TestServiceConfigs(t *testing.T) {
	// Every key each config may hold, as a dotted path; tenants and
	// capacity are copied from values as they are and not walked.
	common := []string{"version", "trust_domain", "listen", "data_dir", "tls.ca", "tls.cert", "tls.key",
		"log.level", "log.format", "telemetry.otlp_endpoint", "telemetry.insecure", "telemetry.sample_ratio",
		"telemetry.prometheus_listen", "shutdown_timeout"}
	want := map[string][]string{
		"authority": append(slices.Clone(common), "grant_key", "grant_ttl", "fleet.heartbeat_interval", "fleet.lost_after",
			"store.driver", "store.dsn", "store.max_conns", "audit.auditors", "audit.checkpoint_key", "audit.checkpoint_every",
			"audit.checkpoint_interval", "tenants"),
		"publisher": append(slices.Clone(common), "authority.address", "authority.grant_public_key",
			"store.driver", "store.dsn", "store.max_conns", "scan.decode_depth"),
		"executor": append(slices.Clone(common), "authority.address", "authority.grant_public_key",
			"sandbox.runc", "sandbox.runsc", "sandbox.runsc_platform", "sandbox.uid_base", "sandbox.disk_read_bps",
			"sandbox.disk_write_bps", "sandbox.path", "output_limit", "network.always_deny", "network.max_connections",
			"network.resolvers", "capacity", "images.max_size"),
	}
	full := set("authority.checkpointKeySecret", "k", "executor.sandbox.diskReadBps", "100MiB",
		"executor.sandbox.diskWriteBps", "50MiB", "executor.sandbox.path", "/usr/bin:/bin",
		"executor.network.resolvers", []any{"192.0.2.53"}, "executor.capacity", map[string]any{"memory": "8GiB"})
	for _, vals := range []map[string]any{nil, full} {
		r := render(t, vals)
		for _, part := range parts {
			cfg := serviceConfig(t, r, part)
			var got []string
			flatten("", cfg, &got)
			for _, k := range got {
				if !slices.Contains(want[part], k) {
					t.Errorf("%s config has %s, which is not in its contract", part, k)
				}
			}
			if _, ok := cfg["executor"]; ok {
				t.Errorf("%s config names an executor: the fleet's executors are found by heartbeat", part)
			}
			if cfg["trust_domain"] != "airlock.example.com" {
				t.Errorf("%s trust_domain %v", part, cfg["trust_domain"])
			}
		}
		a := serviceConfig(t, r, "authority")
		if f, _ := a["fleet"].(map[string]any); f["heartbeat_interval"] != "5s" || f["lost_after"] != "30s" {
			t.Errorf("authority fleet %v, want heartbeat_interval 5s, lost_after 30s", a["fleet"])
		}
		for _, part := range []string{"authority", "publisher"} {
			if s, _ := serviceConfig(t, r, part)["store"].(map[string]any); s["driver"] != "postgres" || strings.Contains(s["dsn"].(string), ":PASSWORD@") {
				t.Errorf("%s store %v: want postgres with no password in the DSN", part, s)
			}
		}
		for _, part := range []string{"publisher", "executor"} {
			addr := serviceConfig(t, r, part)["authority"].(map[string]any)["address"]
			if want := name("authority") + "." + namespace + ".svc:7401"; addr != want {
				t.Errorf("%s authority.address %v, want the authority Service %s", part, addr, want)
			}
		}
	}
}

func TestIdentities(t *testing.T) {
	t.Run("spire", func(t *testing.T) {
		r := render(t, nil)
		got := map[string]string{}
		for _, id := range r.spiffeIDs {
			part := id.Spec.PodSelector.MatchLabels["app.kubernetes.io/component"]
			got[part] = id.Spec.SPIFFEIDTemplate
			sel, err := metav1.LabelSelectorAsSelector(id.Spec.PodSelector)
			if err != nil {
				t.Fatal(err)
			}
			if !sel.Matches(labels.Set(podTemplate(r, part).Labels)) {
				t.Errorf("ClusterSPIFFEID %s selects no %s pod", id.Name, part)
			}
			if id.Spec.NamespaceSelector.MatchLabels["kubernetes.io/metadata.name"] != namespace {
				t.Errorf("ClusterSPIFFEID %s is not scoped to the release's namespace", id.Name)
			}
		}
		want := map[string]string{
			"authority": "spiffe://{{ .TrustDomain }}/service/authority",
			"publisher": "spiffe://{{ .TrustDomain }}/service/publisher",
			"executor":  "spiffe://{{ .TrustDomain }}/service/executor/{{ .PodSpec.NodeName }}",
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("SPIFFE ID templates %v, want %v", got, want)
		}
		for _, part := range parts {
			spec := podTemplate(r, part).Spec
			h := initContainer(t, spec, "spiffe-helper")
			if h.RestartPolicy == nil || *h.RestartPolicy != corev1.ContainerRestartPolicyAlways || h.StartupProbe == nil {
				t.Errorf("%s spiffe-helper is not a native sidecar with a startup probe", part)
			}
			if v := volume(t, spec, "spire-agent-socket"); v.CSI == nil || v.CSI.Driver != "csi.spiffe.io" {
				t.Errorf("%s agent socket volume %+v", part, v.VolumeSource)
			}
		}
	})
	t.Run("cert-manager-csi", func(t *testing.T) {
		r := render(t, set("identity.provider", "cert-manager-csi", "identity.certManager.executorNamedByPod", true))
		if len(r.spiffeIDs) != 0 {
			t.Errorf("ClusterSPIFFEIDs rendered with cert-manager: %v", keys(r.spiffeIDs))
		}
		want := map[string]string{
			"authority": "spiffe://airlock.example.com/service/authority",
			"publisher": "spiffe://airlock.example.com/service/publisher",
			"executor":  "spiffe://airlock.example.com/service/executor/${POD_NAME}",
		}
		for _, part := range parts {
			spec := podTemplate(r, part).Spec
			v := volume(t, spec, "tls")
			if v.CSI == nil || v.CSI.Driver != "csi.cert-manager.io" || v.CSI.VolumeAttributes["csi.cert-manager.io/uri-sans"] != want[part] {
				t.Errorf("%s tls volume %+v, want csi.cert-manager.io with URI SAN %s", part, v.VolumeSource, want[part])
			}
			if len(spec.InitContainers) != 0 {
				t.Errorf("%s has init containers with cert-manager: %v", part, spec.InitContainers)
			}
		}
	})
	t.Run("refused", func(t *testing.T) {
		for _, vals := range []map[string]any{
			set("identity.provider", "cert-manager-csi"), // executors named by pod, not accepted
			set("identity.provider", "vault"),
			set("grantKeys.public", map[string]any{"grant.pem": "x"}),
		} {
			if _, err := renderManifest(vals); err == nil {
				t.Errorf("values %v rendered, want a refusal", vals)
			}
		}
	})
}

func TestMetricsAnnotations(t *testing.T) {
	r := render(t, nil)
	for part, port := range map[string]string{"authority": "9464", "publisher": "9465", "executor": "9466"} {
		a := podTemplate(r, part).Annotations
		if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != port || a["prometheus.io/path"] != "/metrics" {
			t.Errorf("%s scrape annotations %v, want port %s", part, a, port)
		}
		if got := serviceConfig(t, r, part)["telemetry"].(map[string]any)["prometheus_listen"]; got != "0.0.0.0:"+port {
			t.Errorf("%s prometheus_listen %v", part, got)
		}
	}
	off := render(t, set("telemetry.prometheusPort", map[string]any{"authority": 0, "publisher": 0, "executor": 0}))
	for _, part := range parts {
		if _, ok := podTemplate(off, part).Annotations["prometheus.io/scrape"]; ok {
			t.Errorf("%s annotated for scraping with metrics off", part)
		}
	}
}

// podSpecs are every pod template the chart renders, by object.
func podSpecs(r *rendered) map[string]corev1.PodSpec {
	out := map[string]corev1.PodSpec{}
	for n, d := range r.deployments {
		out["Deployment "+n] = d.Spec.Template.Spec
	}
	for n, d := range r.daemonSets {
		out["DaemonSet "+n] = d.Spec.Template.Spec
	}
	return out
}

func podTemplate(r *rendered, part string) corev1.PodTemplateSpec {
	if part == "executor" {
		return r.daemonSets[name(part)].Spec.Template
	}
	return r.deployments[name(part)].Spec.Template
}

// serviceConfig is the YAML config of part from its ConfigMap.
func serviceConfig(t *testing.T, r *rendered, part string) map[string]any {
	t.Helper()
	cm, ok := r.configMaps[name(part)]
	if !ok {
		t.Fatalf("no ConfigMap %s", name(part))
	}
	var out map[string]any
	if err := yaml.Unmarshal([]byte(cm.Data[part+".yaml"]), &out); err != nil {
		t.Fatalf("%s config: %v", part, err)
	}
	return out
}

// flatten lists the dotted paths of m's leaves; tenants and capacity are
// leaves.
func flatten(prefix string, m map[string]any, out *[]string) {
	for k, v := range m {
		p := k
		if prefix != "" {
			p = prefix + "." + k
		}
		if sub, ok := v.(map[string]any); ok && p != "tenants" && p != "capacity" {
			flatten(p, sub, out)
			continue
		}
		*out = append(*out, p)
	}
}

func container(t *testing.T, spec corev1.PodSpec, n string) corev1.Container {
	t.Helper()
	return named(t, spec.Containers, func(c corev1.Container) string { return c.Name }, "container", n)
}

func initContainer(t *testing.T, spec corev1.PodSpec, n string) corev1.Container {
	t.Helper()
	return named(t, spec.InitContainers, func(c corev1.Container) string { return c.Name }, "init container", n)
}

func volume(t *testing.T, spec corev1.PodSpec, n string) corev1.Volume {
	t.Helper()
	return named(t, spec.Volumes, func(v corev1.Volume) string { return v.Name }, "volume", n)
}

func mount(t *testing.T, c corev1.Container, n string) corev1.VolumeMount {
	t.Helper()
	return named(t, c.VolumeMounts, func(m corev1.VolumeMount) string { return m.Name }, c.Name+" mount", n)
}

// named is the item of items called n.
func named[T any](t *testing.T, items []T, nameOf func(T) string, what, n string) T {
	t.Helper()
	for _, it := range items {
		if nameOf(it) == n {
			return it
		}
	}
	t.Fatalf("no %s %s", what, n)
	var zero T
	return zero
}

func portIn(ports []networkingv1.NetworkPolicyPort, port int) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if p.Port != nil && p.Port.IntValue() == port {
			return true
		}
	}
	return false
}

// peerIn says whether peers (an empty list is everyone) take in pods with
// these labels in the release's namespace; ipBlocks take in no pod here.
func peerIn(t *testing.T, peers []networkingv1.NetworkPolicyPeer, pod labels.Set) bool {
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		if p.PodSelector == nil || p.NamespaceSelector != nil {
			continue
		}
		sel, err := metav1.LabelSelectorAsSelector(p.PodSelector)
		if err != nil {
			t.Fatal(err)
		}
		if sel.Matches(pod) {
			return true
		}
	}
	return false
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func toAny(s []string) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}
