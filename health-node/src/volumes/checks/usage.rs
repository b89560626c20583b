//! How much room a filesystem has left, and when that is too little.

use health_core::conditions::{CheckFinding, CheckResult};

use super::CheckConfig;

/// Space and inodes as `statvfs` reports them to unprivileged writers
/// (`f_bavail`/`f_favail`: what a pod can still use, without root reserves).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Usage {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
}

impl Usage {
    // The statvfs field types are u64 on 64-bit Linux but not everywhere.
    #[allow(clippy::unnecessary_cast)]
    pub fn from_statvfs(st: &nix::sys::statvfs::Statvfs) -> Usage {
        let unit = match st.fragment_size() as u64 {
            0 => st.block_size() as u64,
            f => f,
        };
        Usage {
            total_bytes: (st.blocks() as u64).saturating_mul(unit),
            free_bytes: (st.blocks_available() as u64).saturating_mul(unit),
            total_inodes: st.files() as u64,
            free_inodes: st.files_available() as u64,
        }
    }
}

/// Capacity and inode findings against the thresholds. Filesystems that do
/// not count (total 0: some FUSE filesystems, btrfs inodes) are not judged.
pub fn evaluate_usage(u: Usage, cfg: &CheckConfig) -> CheckResult {
    let mut findings = Vec::new();
    if u.total_bytes > 0 {
        if u.free_bytes == 0 {
            findings.push(CheckFinding::CapacityExhausted {
                total_bytes: u.total_bytes,
            });
        } else if below(u.free_bytes, u.total_bytes, cfg.capacity_low_percent) {
            findings.push(CheckFinding::CapacityLow {
                free_bytes: u.free_bytes,
                total_bytes: u.total_bytes,
                threshold_percent: cfg.capacity_low_percent,
            });
        }
    }
    if u.total_inodes > 0 {
        if u.free_inodes == 0 {
            findings.push(CheckFinding::InodesExhausted {
                total: u.total_inodes,
            });
        } else if below(u.free_inodes, u.total_inodes, cfg.inodes_low_percent) {
            findings.push(CheckFinding::InodesLow {
                free: u.free_inodes,
                total: u.total_inodes,
                threshold_percent: cfg.inodes_low_percent,
            });
        }
    }
    if findings.is_empty() {
        CheckResult::Pass
    } else {
        CheckResult::Found(findings)
    }
}

fn below(free: u64, total: u64, percent: f64) -> bool {
    (free as f64) * 100.0 < percent * (total as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volumes::checks::tests::cfg;

    #[test]
    fn usage_thresholds() {
        let u = |free_bytes, free_inodes| Usage {
            total_bytes: 1000,
            free_bytes,
            total_inodes: 200,
            free_inodes,
        };
        assert_eq!(evaluate_usage(u(500, 100), &cfg()), CheckResult::Pass);
        // Exactly 5 % is not below 5 %.
        assert_eq!(evaluate_usage(u(50, 10), &cfg()), CheckResult::Pass);
        let reasons = |r: CheckResult| match r {
            CheckResult::Found(f) => f.iter().map(|f| f.reason()).collect::<Vec<_>>(),
            other => panic!("expected findings, got {other:?}"),
        };
        assert_eq!(
            reasons(evaluate_usage(u(49, 9), &cfg())),
            ["CapacityLow", "InodesLow"]
        );
        assert_eq!(
            reasons(evaluate_usage(u(0, 0), &cfg())),
            ["CapacityExhausted", "InodesExhausted"]
        );
        // Filesystems without inode accounting are not judged on inodes.
        let btrfs_like = Usage {
            total_inodes: 0,
            free_inodes: 0,
            ..u(500, 0)
        };
        assert_eq!(evaluate_usage(btrfs_like, &cfg()), CheckResult::Pass);
        match evaluate_usage(u(10, 100), &cfg()) {
            CheckResult::Found(f) => {
                assert_eq!(
                    f[0].message(),
                    "10 of 1000 bytes free (10 B of 1000 B, 1.00%), below 5%"
                )
            }
            other => panic!("{other:?}"),
        }
    }
}
