// Package e2e owns Airlock's end-to-end tests: they build the real airlock,
// authority, executor and publisher binaries (and grpc-health-probe) once,
// start them as separate processes with `airlock dev up`, and check them from
// the outside over real mTLS on loopback: process life cycle, health, the
// authorization table of every RPC, certificate trust and rotation, config
// errors and graceful shutdown. It holds only tests; nothing imports it.
//
// The tests need Linux: they read /proc and make the test process a child
// subreaper so the services, which `dev up` detaches, are reaped by it and
// their exit status can be checked.
package e2e
