//! Pinning a process's threads to one CPU, for timed benchmarks that compare two Envoys.
//!
//! Why: on a small shared machine the scheduler moves Envoy, the load generator and the
//! upstream between cores from run to run, and two identical Envoys measured side by side
//! then differ by more than the effect being measured (about 20 us per request at 4 KB
//! here, BENCHMARKS.md). With every Envoy under test on one core and the generator on
//! another, placement is the same for both sides of a comparison.

use std::io;

/// Pin every thread of process `pid` to CPU `cpu`. Threads it starts later inherit the
/// mask from the thread that starts them. Linux only; elsewhere `Unsupported`.
pub fn pin_process(pid: u32, cpu: usize) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
            let tid: i32 = task?
                .file_name()
                .to_str()
                .and_then(|t| t.parse().ok())
                .ok_or_else(|| io::Error::other("a /proc task that is not a thread id"))?;
            pin_thread(tid, cpu)?;
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (pid, cpu);
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "pinning is Linux-only",
        ))
    }
}

#[cfg(target_os = "linux")]
fn pin_thread(tid: i32, cpu: usize) -> io::Result<()> {
    use rustix::thread::{CpuSet, sched_setaffinity};
    if cpu >= CpuSet::MAX_CPU {
        return Err(io::Error::other(format!("no CPU {cpu}")));
    }
    let mut set = CpuSet::new();
    set.set(cpu);
    let pid = rustix::process::Pid::from_raw(tid).ok_or_else(|| io::Error::other("thread id 0"))?;
    match sched_setaffinity(Some(pid), &set) {
        Ok(()) => Ok(()),
        // A thread that exited between the listing and the call is not an error.
        Err(e) if e == rustix::io::Errno::SRCH => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The CPUs this process may run on, lowest first: the scheduler's affinity mask, which
/// a container's cpuset narrows (the CPUs need not be 0 and 1). Linux only; elsewhere
/// `Unsupported`.
pub fn allowed() -> io::Result<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        let set = rustix::thread::sched_getaffinity(None)?;
        Ok((0..rustix::thread::CpuSet::MAX_CPU)
            .filter(|&cpu| set.is_set(cpu))
            .collect())
    }
    #[cfg(not(target_os = "linux"))]
    {
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            "CPU affinity is Linux-only",
        ))
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn this_process_may_run_on_the_cpus_the_kernel_lists() {
        let cpus = allowed().expect("affinity");
        let status = std::fs::read_to_string("/proc/self/status").expect("read status");
        let listed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(str::trim)
            .expect("Cpus_allowed_list");
        // The kernel's list is ranges ("0-1,4"): expand it.
        let mut expected = Vec::new();
        for part in listed.split(',') {
            let (low, high) = part.split_once('-').unwrap_or((part, part));
            let (low, high): (usize, usize) =
                (low.parse().expect("cpu"), high.parse().expect("cpu"));
            expected.extend(low..=high);
        }
        assert_eq!(cpus, expected);
    }

    #[test]
    fn a_pinned_child_runs_only_on_its_cpu() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        pin_process(child.id(), 0).expect("pin");
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", child.id())).expect("read status");
        let allowed = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .map(str::trim)
            .map(str::to_string);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(allowed.as_deref(), Some("0"));
    }
}
