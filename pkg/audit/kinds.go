package audit

// The kinds of event the authority records. Every entry it writes has one
// of these, and readers (the CLI's audit list --kind) refuse any other.
const (
	KindApprovalConsumed     = "approval.consumed"
	KindApprovalDecided      = "approval.decided"
	KindApprovalExpired      = "approval.expired"
	KindApprovalOpened       = "approval.opened"
	KindCachesCleared        = "caches.cleared"
	KindExecRequested        = "exec.requested"
	KindFileWritten          = "file.written"
	KindJobCancelled         = "job.cancelled"
	KindJobChangeFailed      = "job.change_failed"
	KindJobChangeRefused     = "job.change_refused"
	KindJobChanged           = "job.changed"
	KindJobGranted           = "job.granted"
	KindJobRefused           = "job.refused"
	KindJobRegranted         = "job.regranted"
	KindLeaseExpired         = "lease.expired"
	KindLeaseIssued          = "lease.issued"
	KindLeaseRevoked         = "lease.revoked"
	KindLeaseUsed            = "lease.used"
	KindPolicyLoaded         = "policy.loaded"
	KindResultRecorded       = "result.recorded"
	KindReviewBundleMismatch = "review.bundle_mismatch"
	KindRpcDenied            = "rpc.denied"
	KindSourceFetched        = "source.fetched"
	KindImageFetched         = "image.fetched"
	KindImagesPruned         = "images.pruned"
	// The executor fleet: an executor joined, was lost, came back, was
	// drained or undrained; a job was placed anew (its executor lost or
	// full) or ended because its executor was lost.
	KindExecutorJoined    = "executor.joined"
	KindExecutorLost      = "executor.lost"
	KindExecutorReturned  = "executor.returned"
	KindExecutorDrained   = "executor.drained"
	KindExecutorUndrained = "executor.undrained"
	KindJobPlaced         = "job.placed"
	KindJobExecutorLost   = "job.executor_lost"
	// A tenant's month-to-date cost reached 80% of its monthly budget
	// (once per tenant and month).
	KindBudgetWarning = "budget.warning"
	// Port forwards into a session: opened (or pending its approval),
	// each connection carried, closed (with the bytes each way), and
	// every refusal.
	KindForwardOpened     = "port_forward.opened"
	KindForwardConnection = "port_forward.connection"
	KindForwardClosed     = "port_forward.closed"
	KindForwardRefused    = "port_forward.refused"
)

// Kinds lists every kind, sorted.
func Kinds() []string {
	return []string{
		KindApprovalConsumed,
		KindApprovalDecided,
		KindApprovalExpired,
		KindApprovalOpened,
		KindCachesCleared,
		KindExecRequested,
		KindFileWritten,
		KindJobCancelled,
		KindJobChangeFailed,
		KindJobChangeRefused,
		KindJobChanged,
		KindJobGranted,
		KindJobRefused,
		KindJobRegranted,
		KindLeaseExpired,
		KindLeaseIssued,
		KindLeaseRevoked,
		KindLeaseUsed,
		KindPolicyLoaded,
		KindResultRecorded,
		KindReviewBundleMismatch,
		KindRpcDenied,
		KindSourceFetched,
		KindImageFetched,
		KindImagesPruned,
		KindExecutorJoined,
		KindExecutorLost,
		KindExecutorReturned,
		KindExecutorDrained,
		KindExecutorUndrained,
		KindJobPlaced,
		KindJobExecutorLost,
		KindBudgetWarning,
		KindForwardOpened,
		KindForwardConnection,
		KindForwardClosed,
		KindForwardRefused,
	}
}
