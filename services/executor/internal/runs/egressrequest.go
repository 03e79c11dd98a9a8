package runs

import "github.com/airlockhq/airlock/services/executor/internal/egressproxy"

// requestOf is the request a request line (egressproxy.ModeRequest) says
// went over an intercepted connection. The egress proxy's Decision.Request
// is not on this branch (egressproxy/credential_stub.go): at merge this
// becomes `return d.Request`.
func requestOf(d egressproxy.Decision) *egressproxy.Request { return d.Request }
