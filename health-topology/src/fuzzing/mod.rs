//! Fuzz entry points of this crate's parsers of outside input (mountinfo,
//! NFS mountstats, the SMB client's DebugData, sysfs, device-mapper status, NVMe SMART log); listed with every other target in `health_node::fuzz_targets`,
//! whose doc gives the convention.

pub mod dm_status;
pub mod mountinfo;
pub mod mountstats;
pub mod nvme_smart;
pub mod smb_client;
pub mod sysfs;
