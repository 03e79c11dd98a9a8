package deploy

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir    = "helm/airlock"
	releaseName = "airlock"
	namespace   = "airlock-system"
)

// clusterSPIFFEID mirrors the fields of SPIRE controller manager's
// ClusterSPIFFEID (spire.spiffe.io/v1alpha1, api/v1alpha1 of
// spiffe/spire-controller-manager) that the chart may set: a field the
// chart renders beyond these fails the strict decode.
type clusterSPIFFEID struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		SPIFFEIDTemplate  string                `json:"spiffeIDTemplate"`
		TTL               metav1.Duration       `json:"ttl,omitempty"`
		NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
		PodSelector       *metav1.LabelSelector `json:"podSelector,omitempty"`
		ClassName         string                `json:"className,omitempty"`
	} `json:"spec"`
}

// rendered is the chart's output, every object decoded into its type.
type rendered struct {
	deployments     map[string]*appsv1.Deployment
	daemonSets      map[string]*appsv1.DaemonSet
	services        map[string]*corev1.Service
	configMaps      map[string]*corev1.ConfigMap
	serviceAccounts map[string]*corev1.ServiceAccount
	pdbs            map[string]*policyv1.PodDisruptionBudget
	netpols         map[string]*networkingv1.NetworkPolicy
	spiffeIDs       map[string]*clusterSPIFFEID
}

// render installs the chart client-only (helm template) with the values
// overrides set on top of values.yaml, and decodes what it renders.
func render(t *testing.T, overrides map[string]any) *rendered {
	t.Helper()
	out, err := renderManifest(overrides)
	if err != nil {
		t.Fatalf("render: %v", err)
	}
	r, err := decodeAll(out)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// kubeVersion is the Kubernetes version the chart is rendered for.
const kubeVersion = "v1.33.0"

// renderManifest renders the chart as helm template does, with Helm's own
// loader, values coalescing and template engine, strict: a template that
// reads a value values.yaml lacks fails.
func renderManifest(overrides map[string]any) (string, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return "", err
	}
	if !chartutil.IsCompatibleRange(chrt.Metadata.KubeVersion, kubeVersion) {
		return "", fmt.Errorf("the chart wants Kubernetes %s, not %s", chrt.Metadata.KubeVersion, kubeVersion)
	}
	caps := chartutil.DefaultCapabilities.Copy()
	caps.KubeVersion = chartutil.KubeVersion{Version: kubeVersion, Major: "1", Minor: "33"}
	vals, err := chartutil.ToRenderValues(chrt, overrides,
		chartutil.ReleaseOptions{Name: releaseName, Namespace: namespace, IsInstall: true}, caps)
	if err != nil {
		return "", err
	}
	files, err := engine.Engine{Strict: true}.Render(chrt, vals)
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		if strings.HasSuffix(n, "NOTES.txt") {
			continue
		}
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", n, files[n])
	}
	return b.String(), nil
}

// decodeAll decodes every document of manifest strictly: duplicate keys,
// fields its type lacks and kinds this test does not know all fail.
func decodeAll(manifest string) (*rendered, error) {
	r := &rendered{
		deployments: map[string]*appsv1.Deployment{}, daemonSets: map[string]*appsv1.DaemonSet{},
		services: map[string]*corev1.Service{}, configMaps: map[string]*corev1.ConfigMap{},
		serviceAccounts: map[string]*corev1.ServiceAccount{}, pdbs: map[string]*policyv1.PodDisruptionBudget{},
		netpols: map[string]*networkingv1.NetworkPolicy{}, spiffeIDs: map[string]*clusterSPIFFEID{},
	}
	docs := releaseutil.SplitManifests(manifest)
	keys := make([]string, 0, len(docs))
	for k := range docs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		doc := docs[k]
		js, err := yaml.YAMLToJSONStrict([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("%s: %v\n%s", k, err, doc)
		}
		if string(js) == "null" {
			continue // only comments: a template that rendered nothing
		}
		var tm metav1.TypeMeta
		if err := json.Unmarshal(js, &tm); err != nil {
			return nil, fmt.Errorf("%s: %v", k, err)
		}
		switch gvk := tm.APIVersion + " " + tm.Kind; gvk {
		case "apps/v1 Deployment":
			err = put(r.deployments, js)
		case "apps/v1 DaemonSet":
			err = put(r.daemonSets, js)
		case "v1 Service":
			err = put(r.services, js)
		case "v1 ConfigMap":
			err = put(r.configMaps, js)
		case "v1 ServiceAccount":
			err = put(r.serviceAccounts, js)
		case "policy/v1 PodDisruptionBudget":
			err = put(r.pdbs, js)
		case "networking.k8s.io/v1 NetworkPolicy":
			err = put(r.netpols, js)
		case "spire.spiffe.io/v1alpha1 ClusterSPIFFEID":
			err = put(r.spiffeIDs, js)
		default:
			return nil, fmt.Errorf("%s: kind %q this test does not know\n%s", k, gvk, doc)
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %v\n%s", tm.APIVersion, tm.Kind, err, doc)
		}
	}
	return r, nil
}

// put decodes one object strictly into a new T and files it by name; a
// name rendered twice is an error.
func put[T any, PT interface {
	*T
	GetName() string
}](m map[string]*T, js []byte) error {
	o := PT(new(T))
	if err := strictJSON(js, o); err != nil {
		return err
	}
	n := o.GetName()
	if n == "" {
		return fmt.Errorf("no name")
	}
	if _, dup := m[n]; dup {
		return fmt.Errorf("%s rendered twice", n)
	}
	m[n] = o
	return nil
}

// strictJSON decodes one JSON value into out, refusing unknown fields and
// anything after the value.
func strictJSON(js []byte, out any) error {
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return fmt.Errorf("data after the object")
	}
	return nil
}

// name is the object name of one part of the release.
func name(part string) string { return releaseName + "-" + part }

// set builds an overrides map from dotted keys: set("a.b", 1, "c", 2).
func set(kv ...any) map[string]any {
	out := map[string]any{}
	for i := 0; i < len(kv); i += 2 {
		path := strings.Split(kv[i].(string), ".")
		m := out
		for _, p := range path[:len(path)-1] {
			next, ok := m[p].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[p] = next
			}
			m = next
		}
		m[path[len(path)-1]] = kv[i+1]
	}
	return out
}
