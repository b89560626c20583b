//! Shared by deploy_monitoring.rs: the series the code exports, the PromQL
//! checker, and typed forms of the monitoring objects the chart renders.

pub mod dashboard;
pub mod exported;
pub mod operator;
pub mod promql;
