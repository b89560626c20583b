//! Guests side by side: which guests boot (a second one of a kernel with
//! steps left), at most `--jobs` at a time, and how each went.

use std::path::Path;

use anyhow::bail;

use super::guest::{self, Machine, Outcome};
use super::kernels::Kernel;
use super::queue::{Queue, StepResult};
use super::script::{Env, Step};
use super::tools::Tools;
use crate::util::say;

/// One kernel's guests: what they boot, and the steps they share.
pub(super) struct KernelGuests {
    pub(super) name: &'static str,
    pub(super) tools: Tools,
    pub(super) kernel: Kernel,
    pub(super) steps: Vec<Step>,
}

/// Boots each kernel's guests, at most `jobs_at_once` at a time (each
/// `machine` as given, labelled when several run), retries a guest once
/// where QEMU's TCG and not a test failed it, checks that every step ran
/// to its end somewhere, and says how each guest went.
pub(super) fn boot(
    guests: &[KernelGuests],
    jobs_at_once: usize,
    machine: &Machine,
    programs: (&Env, Option<&Path>),
) -> anyhow::Result<()> {
    let queues = guests
        .iter()
        .map(|g| Queue::new(g.steps.len()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let step_counts: Vec<usize> = guests.iter().map(|g| g.steps.len()).collect();
    let jobs = guest_jobs(&step_counts);
    let side_by_side = jobs.len() > 1;
    let outcomes = run_guests(&jobs, jobs_at_once, |&(k, nth)| {
        let KernelGuests {
            name,
            tools,
            kernel,
            steps,
        } = &guests[k];
        let queue = &queues[k];
        // A second guest only for steps the first has not started.
        if nth > 1 && queue.not_taken().is_empty() {
            return None;
        }
        let label = match nth {
            1 => name.to_string(),
            n => format!("{name}#{n}"),
        };
        let machine = Machine {
            memory: machine.memory.clone(),
            cpus: machine.cpus,
            timeout: machine.timeout,
            label: side_by_side.then(|| label.clone()),
        };
        let run = || guest::run_in_guest(tools, kernel, &machine, (queue, steps), programs);
        let outcome = match run() {
            Err(e) if e.downcast_ref::<guest::GuestStalled>().is_some() => {
                say(format!("{label}: {e:#}"));
                say(format!("{label}: the guest stalled (QEMU's TCG, not a test): running its unfinished steps again in a fresh guest, once"));
                queue
                    .release_unfinished(&machine.queue_name(kernel))
                    .and_then(|_| run())
            }
            Err(e) if e.downcast_ref::<guest::BootCrashed>().is_some() => {
                say(format!("{label}: {e:#}"));
                say(format!("{label}: no step had started (QEMU's TCG, not a test): booting a fresh guest, once"));
                run()
            }
            result => result,
        };
        Some((label, outcome))
    });
    let outcomes: Vec<(String, anyhow::Result<Outcome>)> = outcomes.into_iter().flatten().collect();
    let mut failed = outcomes.iter().any(|(_, o)| o.is_err());
    // Every step must have run somewhere: a guest that failed says why.
    for (guest, queue) in guests.iter().zip(&queues) {
        for (i, step) in guest.steps.iter().enumerate() {
            if !matches!(queue.result(i), StepResult::Exited(_)) {
                say(format!(
                    "{}: {} did not run to its end",
                    guest.name, step.label
                ));
                failed = true;
            }
        }
    }
    if failed {
        for queue in queues {
            say(format!(
                "the guests' files are kept in {}",
                queue.keep().display()
            ));
        }
        if outcomes.iter().all(|(_, o)| o.is_ok()) {
            bail!("a step did not run to its end in any guest");
        }
    }
    report(&outcomes)
}

/// The guests to boot, as (kernel index, 1 or 2), from each kernel's
/// number of steps: the guest of each kernel with steps, then a second
/// guest of each kernel with several, booted when a slot frees if that
/// kernel still has steps no guest has started ([`super::queue`]).
pub(super) fn guest_jobs(steps: &[usize]) -> Vec<(usize, u32)> {
    let with = |least: usize| {
        steps
            .iter()
            .enumerate()
            .filter(move |(_, n)| **n >= least)
            .map(|(k, _)| k)
    };
    let mut jobs: Vec<(usize, u32)> = with(1).map(|k| (k, 1)).collect();
    jobs.extend(with(2).map(|k| (k, 2)));
    jobs
}

/// Runs `work` on every item, at most `jobs` at a time, and returns the
/// results in the items' order. std's scoped threads and a shared index:
/// three guests need no thread-pool crate.
pub(super) fn run_guests<T: Sync, R: Send>(
    items: &[T],
    jobs: usize,
    work: impl Fn(&T) -> R + Sync,
) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<R>>> =
        items.iter().map(|_| std::sync::Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..jobs.min(items.len()) {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(item) = items.get(i) else { break };
                let result = work(item);
                *results[i].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
            });
        }
    });
    results
        .into_iter()
        .map(|r| {
            r.into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("every item was taken by a worker")
        })
        .collect()
}

/// Says how each guest went; fails with the first failure, or exits with
/// a command's own exit code, as if it had run here.
pub(super) fn report(outcomes: &[(String, anyhow::Result<Outcome>)]) -> anyhow::Result<()> {
    let mut exit_code = 0;
    let mut failures = Vec::new();
    for (name, outcome) in outcomes {
        let prefix = if outcomes.len() > 1 {
            format!("{name}: ")
        } else {
            String::new()
        };
        match outcome {
            Ok(o) => {
                let scratch = o.scratch_bytes.map_or(String::new(), |b| {
                    format!(", scratch disk {} MiB of the host's", b >> 20)
                });
                say(format!(
                    "{prefix}boot {:.1} s, command {:.1} s, exit code {}{scratch}",
                    o.boot.as_secs_f64(),
                    o.command.as_secs_f64(),
                    o.exit_code
                ));
                for failure in &o.failures {
                    say(format!("{prefix}failed: {failure}"));
                }
                if o.exit_code != 0 && exit_code == 0 {
                    exit_code = o.exit_code;
                }
            }
            Err(e) => failures.push(format!("{prefix}{e:#}")),
        }
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("\n"));
    }
    if exit_code != 0 {
        std::process::exit(exit_code.clamp(1, 255));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn guests_run_at_most_jobs_at_a_time_and_answer_in_order() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (running, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let results = run_guests(&[1, 2, 3, 4, 5], 2, |n| {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(20));
            running.fetch_sub(1, Ordering::SeqCst);
            n * 10
        });
        assert_eq!(results, vec![10, 20, 30, 40, 50]);
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    /// Each kernel's guest first, then the second guests, which take only
    /// steps not yet started; one step needs no second guest, and a kernel
    /// without steps no guest at all.
    #[test]
    fn second_guests_come_after_every_kernels_first() {
        assert_eq!(
            guest_jobs(&[9, 9, 9]),
            [(0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2)]
        );
        assert_eq!(guest_jobs(&[1, 1]), [(0, 1), (1, 1)]);
        assert_eq!(
            guest_jobs(&[3, 0, 1, 2]),
            [(0, 1), (2, 1), (3, 1), (0, 2), (3, 2)]
        );
        assert_eq!(guest_jobs(&[0]), []);
    }
}
