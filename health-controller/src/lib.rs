//! The cluster-side controller (`health-controller`): the cluster-side half
//! of KEP-1432, a sidecar in a CSI driver's controller pod sharing its
//! socket. One replica works (the Lease holder, [`leader`]); the others
//! stand by. Uses `health-core` (conditions), `health-kube` (Events,
//! `VolumeHealth`, metrics) and `health-csi`; no aya and no kernel programs,
//! so its image carries neither.
//!
//! Where a backend condition travels: the leader's cycle ([`cycle`]) asks
//! the driver's controller service about every PV of the driver (one List
//! walk, or one Get per volume) -> one observation per PV feeds that PV's
//! [`health_core::conditions::VolumeHealth`] ([`pvs`]) -> the changes
//! go to the event recorder ([`health_kube::events`]) on the PV's claim ->
//! the writer ([`health_kube::writer`]) creates or patches the Event. Only
//! changes are written: a volume abnormal for a day costs one Warning, and
//! its recovery one Normal `<Reason>Cleared`.
//!
//! Beside it, [`nodes`] turns a node down past `--node-grace` into an
//! `Inaccessible NodeNotReady` condition on the pods there that use the
//! driver's claims, and on those claims. [`inventory`] holds the PVs ([`pv_store`]:
//! only this driver's, shared by the cycles) and Nodes (no PVC or Pod
//! watch).
//!
//! A takeover continues Events instead of duplicating them: the new leader
//! lists the Events of its component (any replica's), seeds its PV states
//! from the open Warnings (and from what the claims' `VolumeHealth`
//! objects say the driver asserted), and patches those same Events from
//! then on, as their `reportingInstance`. A recovery Event on a claim is
//! written once its `VolumeHealth` and label no longer say so: the Events,
//! the object and the label tell one story, across takeovers too.
//!
//! The modules, from the process down: [`run`] (start, stand-by, leading,
//! stop) -> [`worker`] (the leader's work) -> [`cycle`], [`pvs`], [`nodes`],
//! [`status`] -> [`inventory`]; beside them [`leader`] (the Lease),
//! [`metrics`] and [`access`] (what the controller may ask of the API).

pub mod access;
pub mod claim_index;
pub mod cycle;
pub mod inventory;
pub mod leader;
pub mod metrics;
pub mod nodes;
pub mod pv_store;
pub mod pvs;
pub mod run;
pub mod status;
pub mod worker;

pub use access::{API_ACCESS, LEASE_ACCESS};
pub use run::{default_lease_name, run, ControllerOptions, StartError, MAX_PAGES};
pub use worker::{recorder_config, ClusterState, Worker, COMPONENT};
