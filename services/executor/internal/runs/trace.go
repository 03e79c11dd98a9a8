package runs

import "go.opentelemetry.io/otel"

// tracer makes the run manager's spans, on the global tracer provider
// (pkg/telemetry sets it): staging a run's source, making its sandbox
// (airlock.pooled says whether a pooled one was claimed), a session's
// sandbox coming up, a batch job's run. They continue the trace of the
// run's StartJob call, and through it the submission's.
var tracer = otel.Tracer(meterName)
