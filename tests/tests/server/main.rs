//! The suites that need no kernel feature: the real API server's and the
//! fake one's (`apiserver_*`, the controller's), the manifests and the
//! chart (`deploy_*`), the documentation (`docs`). One binary for all of
//! them: each integration test binary links the workspace anew and
//! instantiates kube's, tokio's and hyper's generics again (seventeen of
//! them took more of a fresh build than the agent, docs/benchmarks.md,
//! "CI"). Their tests share no process state, so they run side by side
//! as the tests of one suite always did; the suites that drive the kernel
//! are the host binary's (tests/tests/host/), which holds the kernel one
//! test at a time (tests/src/lib.rs, `KERNEL`).

mod apiserver_deploy;
mod apiserver_flowcontrol;
mod apiserver_helm_release;
mod apiserver_memlock_notes;
mod apiserver_rbac;
mod apiserver_selftest;
mod apiserver_status;
mod apiserver_volumehealth;
mod controller;
mod controller_restart;
mod deploy;
mod deploy_controller;
mod deploy_csi_proxy;
mod deploy_monitoring;
mod deploy_render;
mod deploy_status;
mod docs;
mod envtest_selftest;

// Shared by the suites above.
mod deploy_common;
mod doc_pages;
mod monitoring;
mod status_fixtures;
