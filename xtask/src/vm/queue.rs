//! The steps of one kernel, shared by the guests that boot it.
//!
//! CI runs three kernels two guests at a time: the first two kernels boot
//! together and the third waits for the first slot to free. The kernels'
//! suites differ in length (5.10's take half as long again as 6.12's), so
//! one slot then idled for minutes while the other ran the last kernel's
//! suites alone. Now a slot that frees while a kernel still has steps no
//! guest has started boots a second guest of that kernel, and the two take
//! the remaining steps one at a time, each the next not yet taken.
//!
//! A step is taken by creating its directory here (`mkdir`, atomic on the
//! host's filesystem, which both guests write through their shared
//! directory); its exit code is written into it when it ends. The kernel's
//! verdict is read from those codes, whichever guest ran each step.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::Context;

pub struct Queue {
    dir: tempfile::TempDir,
    steps: usize,
}

/// What became of one step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepResult {
    /// No guest took it.
    NotTaken,
    /// Taken, and no exit code came back (its guest died or stalled).
    Unfinished,
    Exited(i32),
}

impl Queue {
    /// A queue of `steps` steps, none taken, in a new temporary directory.
    pub fn new(steps: usize) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("xtask-vm-")
            .tempdir()
            .context("creating the guests' shared directory")?;
        Ok(Self { dir, steps })
    }

    /// The directory the guests share: theirs are made inside it.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The shell lines that run `body` as step `index` in guest `guest`,
    /// unless another guest took it first; `$rc` is its exit code.
    pub fn take_and_run(&self, index: usize, guest: &str, body: &str) -> String {
        let step = format!(
            "{}/{index}",
            super::script::quote(&self.path().to_string_lossy())
        );
        format!(
            "if mkdir {step} 2>/dev/null; then\n\
             echo {guest} > {step}/by\n\
             {body}\
             echo $rc > {step}/rc.tmp && mv {step}/rc.tmp {step}/rc\n\
             fi\n",
            guest = super::script::quote(guest),
        )
    }

    /// The steps no guest has taken yet, in order.
    pub fn not_taken(&self) -> Vec<usize> {
        (0..self.steps)
            .filter(|i| !self.path().join(i.to_string()).exists())
            .collect()
    }

    /// Gives back the steps `guest` took and did not finish, for a fresh
    /// guest to take again; returns how many.
    pub fn release_unfinished(&self, guest: &str) -> anyhow::Result<usize> {
        let mut released = 0;
        for i in 0..self.steps {
            let step = self.path().join(i.to_string());
            if self.result(i) != StepResult::Unfinished {
                continue;
            }
            let by = fs::read_to_string(step.join("by")).unwrap_or_default();
            // A guest that died between the two lines wrote no name: it was
            // this one, the only guest whose steps are released while the
            // other may still take more.
            if by.trim() == guest || by.is_empty() {
                fs::remove_dir_all(&step)
                    .with_context(|| format!("releasing {}", step.display()))?;
                released += 1;
            }
        }
        Ok(released)
    }

    pub fn result(&self, index: usize) -> StepResult {
        let step = self.path().join(index.to_string());
        if !step.exists() {
            return StepResult::NotTaken;
        }
        match fs::read_to_string(step.join("rc")) {
            Ok(text) => text
                .trim()
                .parse()
                .map_or(StepResult::Unfinished, StepResult::Exited),
            Err(_) => StepResult::Unfinished,
        }
    }

    /// Keeps the directory, with every guest's files, past the run.
    pub fn keep(self) -> PathBuf {
        self.dir.keep()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn run_sh(script: &str) {
        let status = Command::new("sh").arg("-c").arg(script).status().unwrap();
        assert!(status.success(), "{script}");
    }

    /// Two guests' scripts over the same queue: each step runs once, in
    /// whichever came first, and its exit code is the queue's.
    #[test]
    fn each_step_runs_once_whichever_guest_takes_it() {
        let q = Queue::new(3).unwrap();
        let log = q.path().join("log");
        let script = |guest: &str| {
            let mut s = String::new();
            for i in 0..3 {
                let body = format!(
                    "echo {guest}:{i} >> '{}'\nrc={}\n",
                    log.display(),
                    if i == 1 { 7 } else { 0 }
                );
                s.push_str(&q.take_and_run(i, guest, &body));
            }
            s
        };
        assert_eq!(q.not_taken(), [0, 1, 2]);
        // The first guest takes step 0 only (as if it were still running
        // it when the second came up).
        run_sh(&q.take_and_run(
            0,
            "6.12",
            &format!("echo 6.12:0 >> '{}'\nrc=0\n", log.display()),
        ));
        assert_eq!(q.not_taken(), [1, 2]);
        run_sh(&script("6.12#2"));
        run_sh(&script("6.12"));
        assert_eq!(
            fs::read_to_string(&log).unwrap(),
            "6.12:0\n6.12#2:1\n6.12#2:2\n"
        );
        assert_eq!(
            (0..3).map(|i| q.result(i)).collect::<Vec<_>>(),
            [
                StepResult::Exited(0),
                StepResult::Exited(7),
                StepResult::Exited(0)
            ]
        );
        assert!(q.not_taken().is_empty());
    }

    /// A step its guest did not finish is given back for a fresh guest;
    /// the other guest's steps, finished or not, stay taken.
    #[test]
    fn a_stalled_guests_unfinished_steps_are_released() {
        let q = Queue::new(3).unwrap();
        run_sh(&q.take_and_run(0, "6.1", "rc=0\n"));
        // Taken and never finished: step 1 by 6.1, step 2 by 6.1#2.
        for (i, guest) in [(1, "6.1"), (2, "6.1#2")] {
            fs::create_dir(q.path().join(i.to_string())).unwrap();
            fs::write(q.path().join(format!("{i}/by")), format!("{guest}\n")).unwrap();
        }
        assert_eq!(q.result(1), StepResult::Unfinished);
        assert_eq!(q.release_unfinished("6.1").unwrap(), 1);
        assert_eq!(
            (0..3).map(|i| q.result(i)).collect::<Vec<_>>(),
            [
                StepResult::Exited(0),
                StepResult::NotTaken,
                StepResult::Unfinished
            ]
        );
        assert_eq!(q.not_taken(), [1]);
    }
}
