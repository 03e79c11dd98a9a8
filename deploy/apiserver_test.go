//go:build apiserver

package deploy

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"helm.sh/helm/v3/pkg/releaseutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// TestChartServerDryRun has a real kube-apiserver (the version
// tools/kubeapiserver pins, on Debian's etcd; cluster_test.go) validate
// every object the chart renders, with a server-side dry-run create and
// strict field validation: what `kubectl apply --dry-run=server` would say
// before an install. The chart's ClusterSPIFFEIDs are checked against
// spire-controller-manager's own CRD (testdata/clusterspiffeid-crd.yaml),
// in a namespace whose Pod Security level is privileged, as the chart's
// README asks. Beyond the property tests' strict decode into the Go
// types, this catches what only the server validates: required fields,
// value ranges, immutable combinations, the CRD's schema, the
// privileged executor against --allow-privileged=true.
//
// Run it with `make test-chart`: the build tag keeps it out of `go test
// ./...`, since building kube-apiserver takes ~15 minutes cold.
func TestChartServerDryRun(t *testing.T) {
	c := startCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	c.installCRDs(ctx, t, "testdata/clusterspiffeid-crd.yaml")
	c.createNamespace(ctx, t, namespace, map[string]string{
		"pod-security.kubernetes.io/enforce": "privileged",
		"pod-security.kubernetes.io/audit":   "privileged",
		"pod-security.kubernetes.io/warn":    "privileged",
	})

	all := append(variants[:len(variants):len(variants)], struct {
		name   string
		values map[string]any
	}{"cert-manager-csi with replicas and clients", set(
		"identity.provider", "cert-manager-csi", "identity.certManager.executorNamedByPod", true,
		"authority.replicas", 3, "publisher.replicas", 1,
		"networkPolicy.clientsFrom", []any{map[string]any{"ipBlock": map[string]any{"cidr": "192.0.2.0/24"}}},
		"authority.checkpointKeySecret", "airlock-checkpoint-key", "authority.credentialsSecret", "airlock-credentials")})
	for _, v := range all {
		t.Run(v.name, func(t *testing.T) {
			objs := renderObjects(t, v.values)
			for _, o := range objs {
				if warnings, err := c.dryRunCreate(ctx, o); err != nil {
					t.Errorf("the API server refuses %s: %v", describe(o), err)
				} else if len(warnings) > 0 {
					t.Errorf("the API server warns about %s: %s", describe(o), strings.Join(warnings, "; "))
				}
			}
			t.Logf("%d objects", len(objs))
		})
	}

	// The check can fail: objects made invalid in a copy of the default
	// render are refused, each with the server's reason.
	byName := map[string]*unstructured.Unstructured{}
	for _, o := range renderObjects(t, nil) {
		byName[o.GetKind()+"/"+o.GetName()] = o
	}
	for _, tc := range []struct {
		name   string
		object string
		change func(o map[string]any)
		want   string
	}{
		{"negative replicas", "Deployment/" + name("authority"),
			func(o map[string]any) { o["spec"].(map[string]any)["replicas"] = int64(-1) },
			"spec.replicas: Invalid value: -1"},
		{"unknown container field", "DaemonSet/" + name("executor"),
			func(o map[string]any) { podContainer(o, 0)["privilegedd"] = true },
			`unknown field "spec.template.spec.containers[0].privilegedd"`},
		{"container without an image", "Deployment/" + name("publisher"),
			func(o map[string]any) { delete(podContainer(o, 0), "image") },
			"spec.template.spec.containers[0].image: Required value"},
		{"field outside the CRD's schema", "ClusterSPIFFEID/" + name("executor") + "-" + namespace,
			func(o map[string]any) { o["spec"].(map[string]any)["spiffeIDTemplates"] = "spiffe://x/y" },
			`unknown field "spec.spiffeIDTemplates"`},
		{"wrong type for the CRD's schema", "ClusterSPIFFEID/" + name("authority") + "-" + namespace,
			func(o map[string]any) { o["spec"].(map[string]any)["podSelector"] = "app=authority" },
			"spec.podSelector: Invalid value"},
	} {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			orig, ok := byName[tc.object]
			if !ok {
				t.Fatalf("the default render has no %s", tc.object)
			}
			o := orig.DeepCopy()
			tc.change(o.Object)
			_, err := c.dryRunCreate(ctx, o)
			if err == nil {
				t.Fatalf("the API server accepts %s with %s", describe(o), tc.name)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("the API server refuses %s with %q, want it to say %q", describe(o), err, tc.want)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// renderObjects renders the chart with overrides and returns every object
// it renders, untyped, in a stable order (by template, then document).
func renderObjects(t *testing.T, overrides map[string]any) []*unstructured.Unstructured {
	t.Helper()
	out, err := renderManifest(overrides)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	docs := releaseutil.SplitManifests(out)
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var objs []*unstructured.Unstructured
	for _, k := range keys {
		js, err := yaml.YAMLToJSONStrict([]byte(docs[k]))
		if err != nil {
			t.Fatalf("%s: %v\n%s", k, err, docs[k])
		}
		if string(js) == "null" {
			continue // only comments: a template that rendered nothing
		}
		o := &unstructured.Unstructured{}
		if err := o.UnmarshalJSON(js); err != nil {
			t.Fatalf("%s: %v\n%s", k, err, docs[k])
		}
		objs = append(objs, o)
	}
	if len(objs) == 0 {
		t.Fatal("the chart rendered no objects")
	}
	return objs
}

// podContainer is container i of a workload object's pod template.
func podContainer(o map[string]any, i int) map[string]any {
	tmpl := o["spec"].(map[string]any)["template"].(map[string]any)
	return tmpl["spec"].(map[string]any)["containers"].([]any)[i].(map[string]any)
}

func describe(o *unstructured.Unstructured) string {
	return o.GetAPIVersion() + " " + o.GetKind() + " " + o.GetName()
}
