//go:build apiserver

package deploy

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/airlockhq/airlock/pkg/pki"
)

// cluster is a kube-apiserver on Debian's etcd, both on loopback ports
// under a temp dir, with one static admin token: no controllers, no
// kubelet, nothing runs the objects; it only stores and validates them.
type cluster struct {
	dyn      dynamic.Interface
	mapper   *restmapper.DeferredDiscoveryRESTMapper
	warnings *warningLog
}

// startCluster starts etcd and kube-apiserver and waits for the API
// server's /readyz. Both are stopped (SIGTERM, then SIGKILL) when the test
// ends, however it ends; they also get SIGKILL if the test binary dies
// first (Pdeathsig), so no run leaves a process behind.
func startCluster(t *testing.T) *cluster {
	t.Helper()
	kas := kubeAPIServer(t)
	etcdBin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatal("no etcd on PATH: install Debian's etcd-server (make test-chart does)")
	}
	dir := t.TempDir()

	clientPort, peerPort, securePort := freePort(t), freePort(t), freePort(t)
	etcdURL := "http://127.0.0.1:" + clientPort
	peerURL := "http://127.0.0.1:" + peerPort
	etcd := startProcess(t, filepath.Join(dir, "etcd.log"), etcdBin,
		"--name=airlock-test", "--data-dir="+filepath.Join(dir, "etcd"),
		"--listen-client-urls="+etcdURL, "--advertise-client-urls="+etcdURL,
		"--listen-peer-urls="+peerURL, "--initial-advertise-peer-urls="+peerURL,
		"--initial-cluster=airlock-test="+peerURL, "--initial-cluster-state=new")
	waitFor(t, etcd, 60*time.Second, func() error {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(etcdURL + "/health")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("etcd /health: %s", resp.Status)
		}
		return nil
	})

	// A throwaway CA for the serving certificate, an ECDSA key that signs
	// and verifies service-account tokens, one static token for us.
	ca, err := pki.NewCA("kube-apiserver.test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	serving, err := ca.IssueHost(pki.IssueOptions{DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "pki/apiserver.crt"), filepath.Join(dir, "pki/apiserver.key")
	if err := pki.WriteHostPair(certFile, keyFile, serving); err != nil {
		t.Fatal(err)
	}
	saKey, saPub := writeServiceAccountKey(t, filepath.Join(dir, "pki"))
	token := randomHex(t)
	tokens := filepath.Join(dir, "tokens.csv")
	write(t, tokens, []byte(token+`,airlock-test-admin,airlock-test-admin,"system:masters"`+"\n"), 0o600)

	apiserver := startProcess(t, filepath.Join(dir, "kube-apiserver.log"), kas,
		"--etcd-servers="+etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+securePort,
		"--tls-cert-file="+certFile, "--tls-private-key-file="+keyFile, "--cert-dir="+filepath.Join(dir, "certs"),
		"--token-auth-file="+tokens, "--anonymous-auth=false", "--authorization-mode=AlwaysAllow",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file="+saPub, "--service-account-signing-key-file="+saKey,
		"--service-cluster-ip-range=10.96.0.0/16",
		// What the executor's DaemonSet needs, as on most distributions.
		"--allow-privileged=true",
		// Nothing here needs fairness queues or the kubernetes Service's
		// endpoints, and the machine is small.
		"--enable-priority-and-fairness=false", "--endpoint-reconciler-type=none", "--profiling=false")

	warnings := &warningLog{}
	cfg := &rest.Config{
		Host:            "https://127.0.0.1:" + securePort,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.Cert.Raw})},
		WarningHandler:  warnings,
		QPS:             50,
		Burst:           100,
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	waitFor(t, apiserver, 4*time.Minute, func() error {
		req, _ := http.NewRequest(http.MethodGet, cfg.Host+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("kube-apiserver /readyz: %s", resp.Status)
		}
		return nil
	})

	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc)), warnings: warnings}
}

// dryRunCreate sends o to the API server as a create with dryRun=All and
// strict field validation (an unknown or duplicate field is an error, not
// a warning), and returns the warnings the server sent with its answer.
// A namespaced object without a namespace goes to the release's.
func (c *cluster) dryRunCreate(ctx context.Context, o *unstructured.Unstructured) ([]string, error) {
	ri, err := c.resource(o)
	if err != nil {
		return nil, err
	}
	c.warnings.take()
	_, err = ri.Create(ctx, o, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict})
	return c.warnings.take(), err
}

func (c *cluster) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("the API server serves no %s: %w", gvk, err)
	}
	if m.Scope.Name() != meta.RESTScopeNameNamespace {
		return c.dyn.Resource(m.Resource), nil
	}
	ns := o.GetNamespace()
	if ns == "" {
		ns = namespace
	}
	return c.dyn.Resource(m.Resource).Namespace(ns), nil
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installCRDs creates the CustomResourceDefinition in file (for real) and
// waits until it is Established and discovery serves its kind.
func (c *cluster) installCRDs(ctx context.Context, t *testing.T, file string) {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	crd := &unstructured.Unstructured{}
	if err := yaml.Unmarshal(data, &crd.Object); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if _, err := c.dyn.Resource(crdResource).Create(ctx, crd, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}); err != nil {
		t.Fatalf("create the CRD of %s: %v", file, err)
	}
	group, _, _ := unstructured.NestedString(crd.Object, "spec", "group")
	kind, _, _ := unstructured.NestedString(crd.Object, "spec", "names", "kind")
	deadline := time.Now().Add(time.Minute)
	for {
		got, err := c.dyn.Resource(crdResource).Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err == nil && established(got) {
			c.mapper.Reset()
			if _, err = c.mapper.RESTMapping(schema.GroupKind{Group: group, Kind: kind}); err == nil {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("CRD %s not served after a minute: %v", crd.GetName(), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func established(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// createNamespace creates namespace ns (for real) with labels.
func (c *cluster) createNamespace(ctx context.Context, t *testing.T, ns string, labels map[string]string) {
	t.Helper()
	o := &unstructured.Unstructured{}
	o.SetAPIVersion("v1")
	o.SetKind("Namespace")
	o.SetName(ns)
	o.SetLabels(labels)
	if _, err := c.dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}).
		Create(ctx, o, metav1.CreateOptions{FieldValidation: metav1.FieldValidationStrict}); err != nil {
		t.Fatalf("create namespace %s: %v", ns, err)
	}
}

// warningLog keeps the Warning headers of the API server's answers.
type warningLog struct {
	mu   sync.Mutex
	text []string
}

func (w *warningLog) HandleWarningHeader(_ int, _ string, text string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.text = append(w.text, text)
}

// take returns the warnings since the last take and forgets them.
func (w *warningLog) take() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := w.text
	w.text = nil
	return out
}

// kubeAPIServer is the path of the kube-apiserver binary:
// $AIRLOCK_KUBE_APISERVER (make test-chart sets it), or whatever
// tools/kubeapiserver/build.sh builds or finds in its cache.
func kubeAPIServer(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("AIRLOCK_KUBE_APISERVER"); p != "" {
		return p
	}
	t.Log("AIRLOCK_KUBE_APISERVER unset: tools/kubeapiserver/build.sh (~15 minutes when not cached)")
	var stderr bytes.Buffer
	cmd := exec.Command("bash", "../tools/kubeapiserver/build.sh")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("tools/kubeapiserver/build.sh: %v\n%s", err, stderr.String())
	}
	return strings.TrimSpace(string(out))
}

// process is a started server whose output goes to a log file.
type process struct {
	name string
	log  string
	done chan struct{}
	err  error // from Wait, once done is closed
}

// startProcess starts bin with args in its own process group, output to
// logFile, and stops the group when the test ends: SIGTERM, then SIGKILL
// after 10 s. When the test failed, the log's tail goes to the test log.
func startProcess(t *testing.T, logFile, bin string, args ...string) *process {
	t.Helper()
	f, err := os.Create(logFile)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	// Pdeathsig: killed with the test binary even when no cleanup runs.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", bin, err)
	}
	p := &process{name: filepath.Base(bin), log: logFile, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		pgid := cmd.Process.Pid
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			<-p.done
		}
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", p.name, tail(p.log, 40))
		}
	})
	return p
}

// waitFor polls ready until it succeeds, failing the test when p exits
// first or timeout passes.
func waitFor(t *testing.T, p *process, timeout time.Duration, ready func() error) {
	t.Helper()
	start := time.Now()
	var err error
	for {
		select {
		case <-p.done:
			t.Fatalf("%s exited before it was ready (%v):\n%s", p.name, p.err, tail(p.log, 40))
		default:
		}
		if err = ready(); err == nil {
			t.Logf("%s ready in %v", p.name, time.Since(start).Round(100*time.Millisecond))
			return
		}
		if time.Since(start) > timeout {
			t.Fatalf("%s not ready after %v: %v", p.name, timeout, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// freePort is a loopback TCP port free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

// writeServiceAccountKey writes a P-256 key (PKCS #8) and its public key
// (PKIX) under dir for the API server's service-account tokens.
func writeServiceAccountKey(t *testing.T, dir string) (keyFile, pubFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	if err != nil {
		t.Fatal(err)
	}
	keyFile, pubFile = filepath.Join(dir, "sa.key"), filepath.Join(dir, "sa.pub")
	write(t, keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600)
	write(t, pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644)
	return keyFile, pubFile
}

func randomHex(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// tail is the last n lines of file.
func tail(file string, n int) string {
	data, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
