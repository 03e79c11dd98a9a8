package daemon

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlockhq/airlock/pkg/config"
	"github.com/airlockhq/airlock/pkg/identity"
	"github.com/airlockhq/airlock/pkg/pki"
)

// TestWrongCertificate starts the authority with a tls.cert that is not
// its own and checks what it prints: the service named once, then what to
// fix, trust_domain or the certificate.
func TestWrongCertificate(t *testing.T) {
	ours, theirs := t.TempDir(), t.TempDir()
	dev, err := identity.New("a.test", identity.KindClient, "dev")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Init(ours, "a.test", []identity.ID{dev}); err != nil {
		t.Fatal(err)
	}
	if _, err := pki.Init(theirs, "b.test", nil); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		ca        string
		cert, key string // default: b.test's authority certificate
		want      string
	}{
		{
			name: "another identity's",
			ca:   pki.CAPath(ours),
			cert: filepath.Join(ours, "client", "dev.crt"), key: filepath.Join(ours, "client", "dev.key"),
			want: "authority: tls.cert is for spiffe://a.test/client/dev, not the authority (spiffe://a.test/service/authority): " +
				"point tls.cert and tls.key at the authority's certificate and key, or issue them with `airlock pki issue --dir " + ours + " --id service/authority`\n",
		},
		{
			name: "trust_domain is the odd one out",
			ca:   pki.CAPath(theirs),
			want: "authority: tls.cert is for spiffe://b.test/service/authority, but trust_domain is a.test: " +
				"the certificate and the CA in tls.ca are both of trust domain b.test, so fix trust_domain in the config (trust_domain: b.test)\n",
		},
		{
			name: "the certificate is the odd one out",
			ca:   pki.CAPath(ours),
			want: "authority: tls.cert is for spiffe://b.test/service/authority, but trust_domain is a.test, and the certificate does not verify against the CA in tls.ca: " +
				"reissue it from that CA with `airlock pki issue --dir " + ours + " --id service/authority`\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.cert == "" {
				tc.cert, tc.key = pki.Paths(theirs, identity.Service("b.test", identity.ServiceAuthority))
			}
			spec := Spec{
				Name: "authority",
				Config: config.Server{
					TrustDomain: "a.test", Listen: "127.0.0.1:0", DataDir: t.TempDir(),
					TLS:             config.TLS{CA: tc.ca, Cert: tc.cert, Key: tc.key},
					ShutdownTimeout: time.Second,
				},
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
				Start: func(context.Context, *Env) error {
					t.Error("the service started")
					return nil
				},
			}
			var stderr bytes.Buffer
			code := main("authority", []string{"--config", "unused.yaml"}, io.Discard, &stderr, nil, func(ctx context.Context, _ *Flags) error {
				return Run(ctx, spec)
			})
			if code != 1 || stderr.String() != tc.want {
				t.Errorf("exit %d, printed\n%s\nwant exit 1,\n%s", code, stderr.String(), tc.want)
			}
		})
	}
}

// A service's own flag is parsed beside the common ones and reaches its
// check and run; another service's binary does not take it.
func TestServiceFlag(t *testing.T) {
	var advertise string
	own := ServiceFlag{Name: "advertise", Usage: "host:port", Value: &advertise}
	run := func(context.Context, *Flags) error { return nil }
	if code := main("executor", []string{"--config", "x.yaml", "--advertise", "10.0.0.1:7402"}, io.Discard, io.Discard, nil, run, own); code != 0 || advertise != "10.0.0.1:7402" {
		t.Errorf("exit %d, --advertise %q; want 0 and 10.0.0.1:7402", code, advertise)
	}
	if code := main("authority", []string{"--config", "x.yaml", "--advertise", "10.0.0.1:7402"}, io.Discard, io.Discard, nil, run); code != 2 {
		t.Errorf("the authority took --advertise: exit %d, want 2", code)
	}
}

// TestStopWhileStarting: a service asked to stop while its Start still
// runs (an executor's long recovery) stops cleanly, exit 0, once Start
// returns the context's error: the tasks Start began end first, then its
// cleanups run, and it says so. A Start that fails on its own, or with a
// canceled context of its own making, is still a failure.
func TestStopWhileStarting(t *testing.T) {
	ownCtx, ownCancel := context.WithCancel(context.Background())
	ownCancel()
	for _, tc := range []struct {
		name    string
		stop    bool // cancel Run's context once Start runs
		start   func(ctx context.Context) error
		wantErr string
	}{
		{"stopped during start", true, func(ctx context.Context) error {
			<-ctx.Done()
			return fmt.Errorf("runs: recover sandboxes: %w", ctx.Err())
		}, ""},
		{"start fails", false, func(context.Context) error { return errors.New("bad config") }, "start: bad config"},
		{"start fails with its own canceled context", false, func(context.Context) error { return ownCtx.Err() }, "start: context canceled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec, _ := metricsSpec(t, "127.0.0.1:0", "")
			var logs bytes.Buffer // read once Run has returned
			spec.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var taskEnded, cleanedAfterTask atomic.Bool
			cleaned := false
			spec.Start = func(sctx context.Context, env *Env) error {
				env.Go(func(ctx context.Context) error {
					<-ctx.Done()
					time.Sleep(100 * time.Millisecond) // a task that takes a moment to stop
					taskEnded.Store(true)
					return ctx.Err()
				})
				env.OnStop(func() error { cleaned = true; cleanedAfterTask.Store(taskEnded.Load()); return nil })
				if tc.stop {
					cancel()
				}
				return tc.start(sctx)
			}
			done := make(chan error, 1)
			go func() { done <- Run(ctx, spec) }()
			select {
			case err := <-done:
				if got := fmt.Sprint(err); (tc.wantErr == "" && err != nil) || (tc.wantErr != "" && got != tc.wantErr) {
					t.Fatalf("Run: %v, want %q", err, tc.wantErr)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return 30s after its Start ended")
			}
			if !cleaned {
				t.Error("the cleanup Start registered did not run")
			}
			if said := strings.Contains(logs.String(), "stopped while starting"); said != tc.stop {
				t.Errorf("the log says \"stopped while starting\": %v, want %v; log:\n%s", said, tc.stop, logs.String())
			}
			if tc.stop && !cleanedAfterTask.Load() {
				t.Error("the cleanup ran before the task Start began had ended")
			}
		})
	}
}
