package selftest

import (
	"context"
	"strings"
	"time"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
	typesv1 "github.com/airlockhq/airlock/proto/airlock/types/v1"
)

// exportFile is where the export row's job plants its fake key: in the
// patch and in /out.
const exportFile = "selftest-export.ini"

func (r *runner) export(ctx context.Context, row *Row, class typesv1.RuntimeClass) {
	if r.opts.PublishTo == "" || r.cl.Publisher == nil || r.cl.Approver == nil {
		// Without an approver the job's approval would stay pending, with
		// a fake key in it, in every approver's queue.
		row.skip("planted key", "not run: pass --publish-to REPO:BRANCH, --pipeline KIND/NAME and --approver KIND/NAME (a dry run; nothing is published; the approver denies the approval the job opens)")
		return
	}
	repo, branch, _ := strings.Cut(r.opts.PublishTo, ":")
	spec := r.spec(class, sh(`k=AKIA$(tr -dc A-Z2-7 </dev/urandom | head -c 16); printf '[default]\naws_access_key_id = %s\n' "$k" > /work/`+exportFile+
		` && cp /work/`+exportFile+` /out/`+exportFile)...)
	spec.PublishTarget = &typesv1.PublishTarget{Repository: repo, Branch: branch}
	res := r.runJob(ctx, spec, r.key(row, "planted-key"))
	if res.err != nil {
		row.fail("planted key", "%v", res.err)
		return
	}
	record(row, res.job)
	j := res.job
	// The approval opens once the result is recorded.
	for end := time.Now().Add(30 * time.Second); j.GetApprovalId() == "" && time.Now().Before(end) && exited(j, 0); {
		time.Sleep(100 * time.Millisecond)
		got, err := r.cl.Client.GetJob(ctx, &authorityv1.GetJobRequest{JobId: j.GetJobId()})
		if err != nil {
			row.fail("planted key", "%v", err)
			return
		}
		j = got.GetJob()
	}
	if !exited(j, 0) || j.GetApprovalId() == "" {
		row.fail("planted key", "the job planting the key ended %s with approval %q; want exit 0 and an approval", jobEnding(j), j.GetApprovalId())
		return
	}
	// The approval stays pending (nobody approves it), so even a
	// publisher that ignored dry_run could push nothing.
	defer r.deny(ctx, j.GetApprovalId())
	resp, err := r.cl.Publisher.Publish(ctx, &publisherv1.PublishRequest{
		JobId: j.GetJobId(), ApprovalId: j.GetApprovalId(), IdempotencyKey: r.key(row, "dry-run"), DryRun: true,
	})
	if err != nil {
		row.fail("planted key", "the dry-run publish: %v", err)
		return
	}
	d := resp.GetDeployment()
	var rules []string
	planted := map[string]bool{}
	for _, f := range d.GetFindings() {
		rules = append(rules, f.GetRule()+" "+f.GetPath())
		if strings.HasPrefix(f.GetRule(), "secret.") && (f.GetPath() == exportFile || f.GetPath() == "/out/"+exportFile) {
			planted[f.GetPath()] = true
		}
	}
	ok := d.GetState() == publisherv1.DeploymentState_DEPLOYMENT_STATE_FAILED && planted[exportFile] && planted["/out/"+exportFile] &&
		strings.HasPrefix(d.GetMessage(), "dry run")
	row.check("planted key", ok, "the publisher's dry run of a result with a fake AWS key in %s and /out/%s: %s, findings %v (%s)",
		exportFile, exportFile, strings.ToLower(strings.TrimPrefix(d.GetState().String(), "DEPLOYMENT_STATE_")), rules, d.GetMessage())
	list, err := r.cl.Publisher.ListDeployments(ctx, &publisherv1.ListDeploymentsRequest{JobId: j.GetJobId()})
	row.check("nothing pushed", err == nil && len(list.GetDeployments()) == 0 && d.GetCommit() == "" && d.GetDeploymentId() == "",
		"the dry run recorded %d deployment(s) for job %s, commit %q (%v)", len(list.GetDeployments()), j.GetJobId(), d.GetCommit(), err)
}
