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
            let tid: libc::pid_t = task?
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
fn pin_thread(tid: libc::pid_t, cpu: usize) -> io::Result<()> {
    if cpu >= libc::CPU_SETSIZE as usize {
        return Err(io::Error::other(format!("no CPU {cpu}")));
    }
    // SAFETY: `set` is a plain bit set owned here; CPU_ZERO/CPU_SET write inside it (the
    // index is checked above) and sched_setaffinity only reads it.
    let rc = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set)
    };
    if rc == 0 {
        Ok(())
    } else {
        let e = io::Error::last_os_error();
        // A thread that exited between the listing and the call is not an error.
        if e.raw_os_error() == Some(libc::ESRCH) {
            Ok(())
        } else {
            Err(e)
        }
    }
}

/// The CPUs this process may run on, lowest first: the scheduler's affinity mask, which
/// a container's cpuset narrows (the CPUs need not be 0 and 1). Linux only; elsewhere
/// `Unsupported`.
pub fn allowed() -> io::Result<Vec<usize>> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: `set` is a plain bit set owned here; sched_getaffinity writes at most
        // its size, and CPU_ISSET reads inside it (indices below CPU_SETSIZE).
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok((0..libc::CPU_SETSIZE as usize)
                .filter(|&cpu| libc::CPU_ISSET(cpu, &set))
                .collect())
        }
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
