//! `health-agent controller`: the cluster-side KEP-1432 controller, a sidecar
//! in a CSI driver's controller pod. This file holds only its API access, so
//! that deploy/controller/ and its tests can be written against it.

use crate::k8s::ApiAccess;

/// Everything the controller asks of the API server, cluster-wide
/// (deploy/controller/clusterrole.yaml grants exactly these).
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "",
        resource: "persistentvolumes",
        verbs: &["list", "watch"],
    },
    ApiAccess {
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
    },
    ApiAccess {
        group: "",
        resource: "pods",
        verbs: &["list"],
    },
    ApiAccess {
        group: "",
        resource: "events",
        verbs: &["create", "patch", "list"],
    },
];

/// The leader election lease, in the controller's own namespace only
/// (deploy/controller/role.yaml grants exactly these).
pub const LEASE_ACCESS: &[ApiAccess] = &[ApiAccess {
    group: "coordination.k8s.io",
    resource: "leases",
    verbs: &["get", "create", "patch"],
}];
