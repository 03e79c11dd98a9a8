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
	}
}
