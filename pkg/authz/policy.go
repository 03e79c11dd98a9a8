package authz

import (
	"google.golang.org/grpc/health/grpc_health_v1"

	authorityv1 "github.com/airlockhq/airlock/proto/airlock/authority/v1"
	executorv1 "github.com/airlockhq/airlock/proto/airlock/executor/v1"
	publisherv1 "github.com/airlockhq/airlock/proto/airlock/publisher/v1"
)

// The tables below are the whole of who may call what. Reviewing a change to
// Airlock's trust boundaries starts here.

// AuthorityTable is the authority's table.
var AuthorityTable = Merge(Infrastructure, Table{
	authorityv1.AuthorityService_SubmitJob_FullMethodName: {Clients},
	authorityv1.AuthorityService_GetJob_FullMethodName:    {Clients},
	// The handler scopes it to the caller's tenant, as GetJob.
	authorityv1.AuthorityService_GetJobEgress_FullMethodName: {Clients},
	authorityv1.AuthorityService_ListJobs_FullMethodName:     {Clients},
	authorityv1.AuthorityService_WatchJob_FullMethodName:     {Clients},
	authorityv1.AuthorityService_CancelJob_FullMethodName:    {Clients},
	// An auditor's copy of a result bundle: the tenant's clients and the
	// approvers its policy lists (the handler scopes it), as ReadReview.
	authorityv1.AuthorityService_DownloadBundle_FullMethodName: {Clients, Approvers},
	// Sessions are jobs: the same callers, the handler scoping each to
	// the session's tenant.
	authorityv1.AuthorityService_CreateSession_FullMethodName:  {Clients},
	authorityv1.AuthorityService_GetSession_FullMethodName:     {Clients},
	authorityv1.AuthorityService_ListSessions_FullMethodName:   {Clients},
	authorityv1.AuthorityService_FinishSession_FullMethodName:  {Clients},
	authorityv1.AuthorityService_CancelSession_FullMethodName:  {Clients},
	authorityv1.AuthorityService_SuspendSession_FullMethodName: {Clients},
	authorityv1.AuthorityService_ResumeSession_FullMethodName:  {Clients},
	authorityv1.AuthorityService_StartExec_FullMethodName:      {Clients},
	authorityv1.AuthorityService_GetExec_FullMethodName:        {Clients},
	authorityv1.AuthorityService_WatchExec_FullMethodName:      {Clients},
	authorityv1.AuthorityService_CancelExec_FullMethodName:     {Clients},
	authorityv1.AuthorityService_RunExec_FullMethodName:        {Clients},
	authorityv1.AuthorityService_ReadFile_FullMethodName:       {Clients},
	authorityv1.AuthorityService_WriteFile_FullMethodName:      {Clients},
	authorityv1.AuthorityService_ListFiles_FullMethodName:      {Clients},
	authorityv1.AuthorityService_ListCaches_FullMethodName:     {Clients},
	authorityv1.AuthorityService_ClearCaches_FullMethodName:    {Clients},
	authorityv1.AuthorityService_ListImages_FullMethodName:     {Clients},
	authorityv1.AuthorityService_PruneImages_FullMethodName:    {Clients},

	// Executors report to the fleet (the handler takes the executor's
	// name from its certificate); operators see and drain it.
	authorityv1.AuthorityService_Heartbeat_FullMethodName:     {Executor},
	authorityv1.AuthorityService_ListExecutors_FullMethodName: {Operators},
	authorityv1.AuthorityService_GetExecutor_FullMethodName:   {Operators},
	authorityv1.AuthorityService_DrainExecutor_FullMethodName: {Operators},

	// Usage and its cost: a tenant's clients and approvers (the handler
	// scopes them to their tenants), operators for every tenant.
	authorityv1.AuthorityService_GetUsage_FullMethodName: {Clients, Approvers, Operators},
	// Port forwards into sessions: a session's own tenant's clients open
	// and carry them (the handler scopes both, and only the opener
	// carries); approvers and operators see them, and either a client or
	// an operator closes one.
	authorityv1.AuthorityService_OpenPortForward_FullMethodName:  {Clients},
	authorityv1.AuthorityService_ForwardPort_FullMethodName:      {Clients},
	authorityv1.AuthorityService_ClosePortForward_FullMethodName: {Clients, Operators},
	authorityv1.AuthorityService_ListPortForwards_FullMethodName: {Clients, Approvers, Operators},

	// Only the executor stages source and reports results; the executor
	// never gets a credential, only the bytes the authority read with it.
	authorityv1.AuthorityService_FetchSource_FullMethodName: {Executor},
	// Images too: the registry credential stays here.
	authorityv1.AuthorityService_FetchImageBlob_FullMethodName: {Executor},
	authorityv1.AuthorityService_ReportResult_FullMethodName:   {Executor},

	// Clients may read their own tenant's approvals (the handler scopes it);
	// only approvers decide, and only the publisher consumes.
	authorityv1.AuthorityService_ListApprovals_FullMethodName:   {Approvers, Clients},
	authorityv1.AuthorityService_GetApproval_FullMethodName:     {Approvers, Clients},
	authorityv1.AuthorityService_ReadReview_FullMethodName:      {Approvers, Clients},
	authorityv1.AuthorityService_DecideApproval_FullMethodName:  {Approvers},
	authorityv1.AuthorityService_ConsumeApproval_FullMethodName: {Publisher},
	authorityv1.AuthorityService_GetPublishSpec_FullMethodName:  {Publisher},

	// The publisher leases deploy and source credentials; an executor the
	// brokered credentials of the jobs placed on it, for their egress
	// proxies (package leases refuses either anything else).
	authorityv1.AuthorityService_LeaseCredential_FullMethodName:  {Publisher, Executor},
	authorityv1.AuthorityService_RevokeCredential_FullMethodName: {Publisher, Executor, Approvers},
	authorityv1.AuthorityService_ListLeases_FullMethodName:       {Approvers, Publisher},

	// The lease's holder announces each use; the handler checks it is the
	// holder.
	authorityv1.AuthorityService_UseLease_FullMethodName: {Publisher},

	// A job's own tenant asks for changes; the handler decides whether an
	// approval is needed.
	authorityv1.AuthorityService_UpdateNetworkPolicy_FullMethodName: {Clients},
	authorityv1.AuthorityService_UpdateJobLimits_FullMethodName:     {Clients},
	// Approvers read the log (the handler scopes it to their tenants
	// unless they are auditors) and anyone of them may keep the
	// checkpoints, which say nothing of any tenant.
	authorityv1.AuthorityService_ListAuditEvents_FullMethodName:      {Approvers},
	authorityv1.AuthorityService_ListAuditCheckpoints_FullMethodName: {Approvers},
})

// ExecutorTable is the executor's table: the authority drives runs, the
// publisher reads finished bundles (and the authority, to stream one to a
// reviewer), and nobody else reaches the executor.
var ExecutorTable = Merge(Infrastructure, Table{
	executorv1.ExecutorService_StartJob_FullMethodName:    {Authority},
	executorv1.ExecutorService_GetRun_FullMethodName:      {Authority},
	executorv1.ExecutorService_WatchRun_FullMethodName:    {Authority},
	executorv1.ExecutorService_CancelRun_FullMethodName:   {Authority},
	executorv1.ExecutorService_UpdateRun_FullMethodName:   {Authority},
	executorv1.ExecutorService_GetArtifact_FullMethodName: {Publisher, Authority},
	executorv1.ExecutorService_StartExec_FullMethodName:   {Authority},
	executorv1.ExecutorService_GetExec_FullMethodName:     {Authority},
	executorv1.ExecutorService_ListExecs_FullMethodName:   {Authority},
	executorv1.ExecutorService_WatchExec_FullMethodName:   {Authority},
	executorv1.ExecutorService_CancelExec_FullMethodName:  {Authority},
	executorv1.ExecutorService_RunExec_FullMethodName:     {Authority},
	executorv1.ExecutorService_FinishRun_FullMethodName:   {Authority},
	executorv1.ExecutorService_SuspendRun_FullMethodName:  {Authority},
	executorv1.ExecutorService_ResumeRun_FullMethodName:   {Authority},
	executorv1.ExecutorService_ForwardPort_FullMethodName: {Authority},
	executorv1.ExecutorService_ReadFile_FullMethodName:    {Authority},
	executorv1.ExecutorService_WriteFile_FullMethodName:   {Authority},
	executorv1.ExecutorService_ListFiles_FullMethodName:   {Authority},
	executorv1.ExecutorService_ListCaches_FullMethodName:  {Authority},
	executorv1.ExecutorService_ListImages_FullMethodName:  {Authority},
	executorv1.ExecutorService_PruneImages_FullMethodName: {Authority},
	executorv1.ExecutorService_ClearCaches_FullMethodName: {Authority},
})

// PublisherTable is the publisher's table.
var PublisherTable = Merge(Infrastructure, Table{
	publisherv1.PublisherService_Publish_FullMethodName:         {Pipelines},
	publisherv1.PublisherService_GetDeployment_FullMethodName:   {Pipelines, Approvers},
	publisherv1.PublisherService_ListDeployments_FullMethodName: {Pipelines, Approvers},
})

// Infrastructure covers the standard services every server carries. Health
// reveals only SERVING or not; reflection is off unless configured and then
// describes only the public API.
var Infrastructure = Table{
	grpc_health_v1.Health_Check_FullMethodName:                       Everyone,
	grpc_health_v1.Health_Watch_FullMethodName:                       Everyone,
	grpc_health_v1.Health_List_FullMethodName:                        Everyone,
	"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo":      Everyone,
	"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": Everyone,
}
