package runspec

// MaxWarmPool bounds a tenant's warm_pool: how many ready sandboxes of one
// shape an executor may be asked to keep for it. The authority refuses a
// policy above it, the executor caps a grant's ask at it, and the dev
// stack's --warm-pool is checked against it.
const MaxWarmPool = 16
