package jobs

import "go.opentelemetry.io/otel"

// tracer makes the job service's spans on the global tracer provider
// (pkg/telemetry sets it): a job's dispatch to its executor, in the trace
// of the call that submitted it.
var tracer = otel.Tracer("github.com/airlockhq/airlock/services/authority/internal/jobs")
