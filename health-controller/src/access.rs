//! What the controller asks of the API server ([`API_ACCESS`], cluster-wide)
//! and of its own namespace ([`LEASE_ACCESS`]): `deploy/` grants exactly
//! these (checked by the manifest tests in `tests/`).

use health_kube::ApiAccess;

/// Everything the controller asks of the API server, cluster-wide:
/// - persistentvolumes: a reflector (this driver's are kept);
/// - nodes: a reflector (Ready condition, unreachable taint);
/// - pods: listed on demand for ONE node that went down
///   (`fieldSelector=spec.nodeName=NODE`); never watched;
/// - events: created, patched to aggregate, listed on taking the lead
///   (`fieldSelector=reportingComponent=volume-health-controller`);
/// - volumehealths: the entries `CSIDriver` and `Controller` of each claim
///   with a condition (read, created and updated by server-side apply,
///   listed on taking the lead); volumehealths/status;
/// - persistentvolumeclaims: patch, the label `volume-health.io/health`;
///   persistentvolumeclaims/status: patch, `healthStatus` where the server
///   has it.
pub const API_ACCESS: &[ApiAccess] = &[
    ApiAccess {
        group: "",
        resource: "persistentvolumes",
        verbs: &["list", "watch"],
        names: &[],
    },
    ApiAccess {
        group: "",
        resource: "nodes",
        verbs: &["list", "watch"],
        names: &[],
    },
    ApiAccess {
        group: "",
        resource: "pods",
        verbs: &["list"],
        names: &[],
    },
    ApiAccess {
        group: "",
        resource: "events",
        verbs: &["create", "patch", "list"],
        names: &[],
    },
    ApiAccess {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["get", "patch"],
        names: &[],
    },
    ApiAccess {
        group: "",
        resource: "persistentvolumeclaims/status",
        verbs: &["patch"],
        names: &[],
    },
    ApiAccess {
        group: health_kube::status::types::GROUP,
        resource: "volumehealths",
        verbs: &["get", "list", "watch", "create", "patch"],
        names: &[],
    },
    ApiAccess {
        group: health_kube::status::types::GROUP,
        resource: "volumehealths/status",
        verbs: &["patch"],
        names: &[],
    },
];

/// What kube-lease-manager 0.13 does with the Lease, in the controller's
/// own namespace: `get` (sync), `create` (when missing), `patch` (acquire,
/// renew and release, server-side apply and strategic merge).
pub const LEASE_ACCESS: &[ApiAccess] = &[ApiAccess {
    group: "coordination.k8s.io",
    resource: "leases",
    verbs: &["get", "create", "patch"],
    names: &[],
}];
