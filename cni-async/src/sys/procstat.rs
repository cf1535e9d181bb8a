//! `/proc/PID/stat`: the one reader of it in the workspace (the process
//! group checks, a process's start time in a namespace's identity, cnid's
//! search for the plugins a dead daemon left).

use std::io;

/// What `/proc/PID/stat` says of a process (or thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcStat {
    /// Its state (field 3: `R`, `S`, `Z`, `X`, ...).
    pub state: char,
    /// Its process group (field 5).
    pub pgrp: u32,
    /// Its session (field 6).
    pub session: u32,
    /// When it started, in clock ticks after boot (field 22): with the
    /// pid, the process's identity.
    pub start_time: u64,
}

impl ProcStat {
    /// Whether it is a zombie or dead (`Z`, `X`): it runs nothing.
    pub fn is_dead(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

/// `/proc/PID/stat` of process `pid`: `Ok(None)` when there is no such
/// process, `Err` when it cannot be read or does not parse.
pub fn proc_stat(pid: u32) -> io::Result<Option<ProcStat>> {
    let text = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    parse(&text)
        .map(Some)
        .ok_or_else(|| io::Error::other(format!("/proc/{pid}/stat: cannot parse {text:?}")))
}

/// The fields of a `/proc/PID/stat` line (`pid (comm) state ppid pgrp
/// session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime
/// cutime cstime priority nice num_threads itrealvalue starttime ...`);
/// the command is in parentheses and may hold anything, parentheses and
/// spaces included: the fields start after the last `)`.
pub(crate) fn parse(stat: &str) -> Option<ProcStat> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().take(20).collect();
    Some(ProcStat {
        state: f.first()?.chars().next()?,
        pgrp: f.get(2)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        start_time: f.get(19)?.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_after_the_last_parenthesis() {
        let stat = "42 (a b) c)) S 1 40 41 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 91234 1000 50";
        assert_eq!(
            parse(stat),
            Some(ProcStat {
                state: 'S',
                pgrp: 40,
                session: 41,
                start_time: 91234
            })
        );
        assert_eq!(parse("42 (x) S 1"), None);
        assert_eq!(parse("garbage"), None);
        let me = proc_stat(std::process::id()).unwrap().unwrap();
        assert!(me.start_time > 0 && !me.is_dead());
        assert_eq!(
            me.pgrp,
            nix::unistd::getpgrp().as_raw().unsigned_abs(),
            "our own group"
        );
        assert_eq!(proc_stat(u32::MAX).unwrap(), None);
    }
}
