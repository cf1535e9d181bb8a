//! A simulated disk for the tests: a [`Storage`] (`cni_async::daemon::Storage`)
//! over a real dir (so the reads, which are not behind the seam, see what
//! was written) with a shadow of what is durable, which models the two
//! kinds of crash. The journal and the result cache both go through it.
//!
//! - A process crash (`kill -9`): the kernel keeps every write. The dir
//!   as it is, is what the next start finds. [`SimDisk::crash_at`] stops
//!   the process at its N-th I/O call: that call and every later one fail
//!   without doing anything (the process is dead; what it still does in
//!   memory reaches no disk, and its temp and lock files stay).
//! - A power loss ([`SimDisk::power_loss`]): only what was flushed
//!   survives. A file's data is durable as of its last `fsync` /
//!   `fdatasync`; a name (a creation, a rename, a removal) as of the last
//!   `fsync` of its dir. Unflushed appends are lost or cut short
//!   ([`Cut`]), unflushed truncations and removals undone, unflushed
//!   creations and renames lost. A dir is a name too: it survives only
//!   when its creation was flushed by an `fsync` of its parent, and so on
//!   up to the root (which always stays), and with it what it holds.
//!   Creating a dir is not a call of the seam; flushing it is.
//! - [`SimDisk::fork`] copies the disk, what is durable of it included:
//!   many restarts from one state without making it again.
//!
//! Composite operations (`cni_async::daemon::durable`'s atomic write: create,
//! write, `fdatasync`, rename, `fsync` of the dir) are made of the
//! primitive calls, each an I/O point of its own. Every call is recorded
//! with its kind, the file's name and its call site (`#[track_caller]`,
//! through `durable`'s functions to the line of the journal or the cache
//! that called them), so that the crash-point enumeration can tell which
//! sites it crashed.

use super::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::os::unix::fs::OpenOptionsExt;
use std::panic::Location;

/// What a power loss leaves of an unflushed tail appended to a flushed
/// file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cut {
    /// Nothing of it (every unflushed write lost).
    None,
    /// Half of it (a write cut short: a torn last line).
    Half,
    /// All of it, and every name change too: the kernel had written
    /// everything back (the dir stays as it is; only the boot changes).
    All,
}

/// One I/O call: its kind, the name of the file or dir it acts on, and
/// its call site (`file:line` in the code under test).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) kind: &'static str,
    pub(crate) name: String,
    pub(crate) site: String,
}

#[derive(Debug, Default)]
struct Shadow {
    calls: Vec<Call>,
    crash_at: Option<usize>,
    fail_at: Option<usize>,
    /// The number of calls made when [`SimDisk::arm_crash`] was called.
    armed: usize,
    dead: bool,
    /// [`Storage::sync_fs`] answers `Unsupported` (a kernel before 5.8).
    no_sync_fs: bool,
    /// Durable data of each file, by inode.
    data: HashMap<u64, Vec<u8>>,
    /// Each file's last modification time as of its flush, by inode
    /// (what a power loss leaves it: the age of a temp file matters).
    mtimes: HashMap<u64, SystemTime>,
    /// Durable names: path to inode.
    names: BTreeMap<PathBuf, u64>,
    /// Durable dirs under the root (the root always is).
    dirs: BTreeSet<PathBuf>,
}

/// The simulated disk over `root` (see the module docs).
#[derive(Debug)]
pub(crate) struct SimDisk {
    root: PathBuf,
    shadow: Mutex<Shadow>,
}

fn dead() -> io::Error {
    io::Error::other("simulated crash: the process is dead")
}

fn site(at: &Location<'_>) -> String {
    let file = Path::new(at.file())
        .file_name()
        .unwrap_or_default()
        .to_string_lossy();
    format!("{file}:{}", at.line())
}

/// Every regular file and every dir under `dir`, recursively (a dir
/// before what it holds).
fn walk(dir: &Path, files: &mut Vec<PathBuf>, dirs: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let Ok(t) = e.file_type() else { continue };
        if t.is_dir() {
            dirs.push(e.path());
            walk(&e.path(), files, dirs);
        } else if t.is_file() {
            files.push(e.path());
        }
    }
}

fn content_of(file: &File) -> io::Result<Vec<u8>> {
    std::fs::read(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// The path a descriptor was opened at (for the record of a call).
fn path_of(file: &File) -> PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).unwrap_or_default()
}

impl SimDisk {
    /// A disk over `root`, everything there durable already.
    pub(crate) fn new(root: &Path) -> Self {
        let sim = SimDisk {
            root: root.to_owned(),
            shadow: Mutex::default(),
        };
        sim.sync_tree(root);
        sim
    }

    /// The process dies at its `n`-th I/O call (from 0).
    pub(crate) fn crash_at(self, n: usize) -> Self {
        self.lock().crash_at = Some(n);
        self
    }

    /// A new process after a `kill -9`, in the same boot: the kernel kept
    /// every write of the dead one, flushed or not, so the shadow stays
    /// as it is (a power loss later still loses what it never flushed).
    /// No crash armed.
    pub(crate) fn revive(&self) {
        let mut s = self.lock();
        s.dead = false;
        s.crash_at = None;
    }

    /// From now on [`Storage::sync_fs`] answers `Unsupported`, as on a
    /// kernel before 5.8 (an I/O call all the same: it may crash or fail).
    pub(crate) fn disable_sync_fs(&self) {
        self.lock().no_sync_fs = true;
    }

    /// The `n`-th I/O call fails with `ENOSPC` (doing nothing); the process
    /// goes on.
    pub(crate) fn fail_at(self, n: usize) -> Self {
        self.lock().fail_at = Some(n);
        self
    }

    /// The process dies at its `n`-th I/O call from now.
    pub(crate) fn arm_crash(&self, n: usize) {
        let mut s = self.lock();
        s.armed = s.calls.len();
        s.crash_at = Some(s.armed + n);
    }

    /// The `n`-th I/O call from now fails with `ENOSPC`.
    pub(crate) fn arm_fail(&self, n: usize) {
        let mut s = self.lock();
        s.armed = s.calls.len();
        s.fail_at = Some(s.armed + n);
    }

    /// How many calls were made since the disk was armed.
    pub(crate) fn calls_since_arm(&self) -> usize {
        let s = self.lock();
        s.calls.len() - s.armed
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shadow> {
        self.shadow.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the process died (the crash point was reached).
    pub(crate) fn dead(&self) -> bool {
        self.lock().dead
    }

    /// The calls made before the crash (or all of them).
    pub(crate) fn calls(&self) -> Vec<Call> {
        let s = self.lock();
        let n = s.crash_at.map_or(s.calls.len(), |c| c.min(s.calls.len()));
        s.calls[..n].to_vec()
    }

    /// The call the process died at, if it did.
    pub(crate) fn crashed_at(&self) -> Option<Call> {
        let s = self.lock();
        s.crash_at.and_then(|c| s.calls.get(c).cloned())
    }

    /// Counts one I/O call; whether it may go ahead.
    fn call(&self, kind: &'static str, path: &Path, at: &Location<'_>) -> io::Result<()> {
        let mut s = self.lock();
        let n = s.calls.len();
        s.calls.push(Call {
            kind,
            name: path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            site: site(at),
        });
        if s.dead {
            return Err(dead());
        }
        if s.crash_at == Some(n) {
            s.dead = true;
            return Err(dead());
        }
        if s.fail_at == Some(n) {
            return Err(io::Error::from_raw_os_error(nix::libc::ENOSPC));
        }
        Ok(())
    }

    fn sync_file_data(&self, file: &File) -> io::Result<()> {
        let meta = file.metadata()?;
        let bytes = content_of(file)?;
        let mut s = self.lock();
        s.data.insert(meta.ino(), bytes);
        if let Ok(t) = meta.modified() {
            s.mtimes.insert(meta.ino(), t);
        }
        Ok(())
    }

    /// Makes the names of `dir`'s entries (files and dirs) durable as
    /// they are now. A dir outside the root (the root's parent) is not
    /// modelled: the root always stays.
    fn sync_names(&self, dir: &Path) -> io::Result<()> {
        let mut now = BTreeMap::new();
        let mut dirs = BTreeSet::new();
        for e in std::fs::read_dir(dir)?.flatten() {
            let Ok(t) = e.file_type() else { continue };
            if t.is_file() {
                now.insert(e.path(), e.metadata()?.ino());
            } else if t.is_dir() {
                dirs.insert(e.path());
            }
        }
        if !dir.starts_with(&self.root) {
            return Ok(());
        }
        let mut s = self.lock();
        s.names.retain(|p, _| p.parent() != Some(dir));
        s.names.extend(now);
        s.dirs.retain(|p| p.parent() != Some(dir));
        s.dirs.extend(dirs);
        Ok(())
    }

    /// Makes everything under `dir` durable as it is now (data and
    /// names, dirs removed under it gone for good; not `dir`'s own entry):
    /// at the start, after a power loss (what is on disk then is all there
    /// is), and for a `syncfs` ([`Storage::sync_fs`]).
    pub(crate) fn sync_tree(&self, dir: &Path) {
        let (mut files, mut dirs) = (Vec::new(), Vec::new());
        walk(dir, &mut files, &mut dirs);
        let mut s = self.lock();
        s.dirs.retain(|p| p == dir || !p.starts_with(dir));
        s.dirs.extend(dirs);
        s.names.retain(|p, _| !p.starts_with(dir));
        for p in files {
            if let (Ok(m), Ok(bytes)) = (std::fs::symlink_metadata(&p), std::fs::read(&p)) {
                s.data.insert(m.ino(), bytes);
                if let Ok(t) = m.modified() {
                    s.mtimes.insert(m.ino(), t);
                }
                s.names.insert(p, m.ino());
            }
        }
    }

    /// The power goes: the dir is made what the disk holds (see the module
    /// docs), and all of it is durable from then on.
    pub(crate) fn power_loss(&self, cut: Cut) {
        if cut == Cut::All {
            *self.lock() = Shadow::default();
            self.sync_tree(&self.root);
            return;
        }
        let (mut now, mut dirs_now) = (Vec::new(), Vec::new());
        walk(&self.root, &mut now, &mut dirs_now);
        let s = self.lock();
        // A dir survives when it and every dir above it (up to the root)
        // are durable names; a file, when its dir survives.
        let survives = |dir: &Path| {
            dir.ancestors()
                .take_while(|a| *a != self.root)
                .all(|a| s.dirs.contains(a))
        };
        let mut after: Vec<(PathBuf, Vec<u8>, Option<SystemTime>)> = Vec::new();
        for (path, ino) in &s.names {
            if !path.parent().is_some_and(survives) {
                continue;
            }
            let durable = s.data.get(ino).cloned().unwrap_or_default();
            let same = std::fs::symlink_metadata(path)
                .ok()
                .filter(|m| m.ino() == *ino);
            let mtime = same
                .as_ref()
                .and_then(|m| m.modified().ok())
                .or_else(|| s.mtimes.get(ino).copied());
            let current = same.and_then(|_| std::fs::read(path).ok());
            let bytes = match current {
                Some(c) if c.len() > durable.len() && c.starts_with(&durable) => {
                    let tail = c.len() - durable.len();
                    let keep = match cut {
                        Cut::None => 0,
                        Cut::Half => tail / 2,
                        Cut::All => tail,
                    };
                    c[..durable.len() + keep].to_vec()
                }
                _ => durable,
            };
            after.push((path.clone(), bytes, mtime));
        }
        let lost_dirs: Vec<&PathBuf> = dirs_now.iter().filter(|d| !survives(d)).collect();
        for p in now {
            std::fs::remove_file(&p).unwrap();
        }
        for d in lost_dirs {
            let _ = std::fs::remove_dir_all(d);
        }
        drop(s);
        for (p, bytes, mtime) in after {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&p)
                .unwrap();
            f.write_all(&bytes).unwrap();
            if let Some(t) = mtime {
                f.set_modified(t).unwrap();
            }
        }
        *self.lock() = Shadow::default();
        self.sync_tree(&self.root);
    }

    /// A copy of this disk over `to` (an empty dir): every file (content,
    /// mode, modification time) and dir under the root copied, and what is
    /// durable of them as it is here, so that a power loss on the copy
    /// keeps what one here would. No call counted, no crash armed, alive:
    /// another process (or the same one, revived) on the same state.
    /// Cheaper than making that state again (the crash-point enumeration
    /// runs many restarts from each state an operation's crash left).
    pub(crate) fn fork(&self, to: &Path) -> SimDisk {
        let (mut files, mut dirs) = (Vec::new(), Vec::new());
        walk(&self.root, &mut files, &mut dirs);
        let moved = |p: &Path| to.join(p.strip_prefix(&self.root).unwrap());
        for d in &dirs {
            std::fs::create_dir(moved(d)).unwrap();
            let mode = std::fs::metadata(d).unwrap().permissions();
            std::fs::set_permissions(moved(d), mode).unwrap();
        }
        // Inodes of the copies, by inode here; those of no file here (a
        // durable name whose file was replaced or removed since) get
        // numbers no file has.
        let mut inodes: HashMap<u64, u64> = HashMap::new();
        for f in &files {
            let mut from = File::open(f).unwrap();
            let meta = from.metadata().unwrap();
            let mut copy = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(meta.mode())
                .open(moved(f))
                .unwrap();
            std::io::copy(&mut from, &mut copy).unwrap();
            copy.set_modified(meta.modified().unwrap()).unwrap();
            inodes.insert(meta.ino(), copy.metadata().unwrap().ino());
        }
        let s = self.lock();
        let mut unused = u64::MAX;
        let mut ino = |old: u64| {
            *inodes.entry(old).or_insert_with(|| {
                unused -= 1;
                unused
            })
        };
        let shadow = Shadow {
            data: s.data.iter().map(|(i, d)| (ino(*i), d.clone())).collect(),
            mtimes: s.mtimes.iter().map(|(i, t)| (ino(*i), *t)).collect(),
            names: s.names.iter().map(|(p, i)| (moved(p), ino(*i))).collect(),
            dirs: s.dirs.iter().map(|d| moved(d)).collect(),
            ..Shadow::default()
        };
        SimDisk {
            root: to.to_owned(),
            shadow: Mutex::new(shadow),
        }
    }
}

impl Storage for SimDisk {
    #[track_caller]
    fn create_new(&self, path: &Path, mode: u32) -> io::Result<File> {
        self.call("create", path, Location::caller())?;
        Disk.create_new(path, mode)
    }

    #[track_caller]
    fn open_append(&self, path: &Path) -> io::Result<File> {
        self.call("open-append", path, Location::caller())?;
        Disk.open_append(path)
    }

    #[track_caller]
    fn open_write(&self, path: &Path) -> io::Result<File> {
        self.call("open-write", path, Location::caller())?;
        Disk.open_write(path)
    }

    #[track_caller]
    fn open_lock(&self, path: &Path) -> io::Result<File> {
        self.call("open-lock", path, Location::caller())?;
        Disk.open_lock(path)
    }

    #[track_caller]
    fn write(&self, file: &File, bytes: &[u8]) -> io::Result<()> {
        self.call("write", &path_of(file), Location::caller())?;
        Disk.write(file, bytes)
    }

    #[track_caller]
    fn truncate(&self, file: &File, len: u64) -> io::Result<()> {
        self.call("truncate", &path_of(file), Location::caller())?;
        Disk.truncate(file, len)
    }

    #[track_caller]
    fn sync_data(&self, file: &File) -> io::Result<()> {
        self.call("fdatasync", &path_of(file), Location::caller())?;
        self.sync_file_data(file)
    }

    #[track_caller]
    fn sync_all(&self, file: &File) -> io::Result<()> {
        self.call("fsync", &path_of(file), Location::caller())?;
        self.sync_file_data(file)
    }

    #[track_caller]
    fn sync_file(&self, path: &Path) -> io::Result<bool> {
        self.call("fsync", path, Location::caller())?;
        match cni_async::daemon::durable::no_follow()
            .read(true)
            .open(path)
        {
            Ok(f) => self.sync_file_data(&f).map(|()| true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(e),
        }
    }

    #[track_caller]
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.call("fsync-dir", dir, Location::caller())?;
        self.sync_names(dir)
    }

    /// Everything under `dir` durable as it is now, data and names, the
    /// dirs under it too (not `dir`'s own entry): what `syncfs` of its
    /// file system guarantees for that subtree. The rest of the simulated
    /// disk is left as it was (it may be another file system): the model
    /// credits the call with no more than the dir it names.
    #[track_caller]
    fn sync_fs(&self, dir: &Path) -> io::Result<()> {
        self.call("syncfs", dir, Location::caller())?;
        if self.lock().no_sync_fs {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "simulated kernel before 5.8",
            ));
        }
        if !std::fs::symlink_metadata(dir)?.is_dir() {
            return Err(io::Error::from_raw_os_error(nix::libc::ENOTDIR));
        }
        self.sync_tree(dir);
        Ok(())
    }

    #[track_caller]
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.call("rename", to, Location::caller())?;
        Disk.rename(from, to)
    }

    #[track_caller]
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.call("remove", path, Location::caller())?;
        Disk.remove(path)
    }

    #[track_caller]
    fn remove_dir(&self, path: &Path) -> io::Result<()> {
        self.call("remove-dir", path, Location::caller())?;
        Disk.remove_dir(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(p: &Path) -> Option<Vec<u8>> {
        std::fs::read(p).ok()
    }

    /// A process crash keeps every write made before it, flushed or not;
    /// from the crash point on, nothing reaches the disk.
    #[test]
    fn a_process_crash_keeps_everything_written_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let sim = SimDisk::new(dir.path()).crash_at(2);
        let f = sim.open_append(&p).unwrap();
        sim.write(&f, b"one\n").unwrap();
        assert!(sim.write(&f, b"two\n").is_err(), "the crash point");
        assert!(sim.dead());
        assert!(sim.sync_all(&f).is_err(), "dead");
        assert_eq!(read(&p).unwrap(), b"one\n", "not flushed, yet kept");
        assert_eq!(sim.calls().len(), 2);
        assert_eq!(sim.crashed_at().unwrap().kind, "write");
    }

    /// A power loss keeps a file's data as of its last flush, and only
    /// when its name was made durable by an fsync of its dir.
    #[test]
    fn a_power_loss_keeps_only_what_was_flushed() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        let sim = SimDisk::new(dir.path());
        let fa = sim.open_append(&a).unwrap();
        sim.write(&fa, b"flushed\n").unwrap();
        sim.sync_data(&fa).unwrap();
        sim.sync_dir(dir.path()).unwrap();
        sim.write(&fa, b"not\n").unwrap();
        let fb = sim.open_append(&b).unwrap();
        sim.write(&fb, b"data flushed, name not\n").unwrap();
        sim.sync_all(&fb).unwrap();
        sim.power_loss(Cut::None);
        assert_eq!(read(&a).unwrap(), b"flushed\n");
        assert_eq!(read(&b), None, "its dir was not fsynced");
    }

    /// A name made durable without its data comes back empty; a removal
    /// or a truncation not flushed is undone; a rename not flushed is lost.
    #[test]
    fn names_need_a_dir_fsync_and_removals_are_undone() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, c) = (
            dir.path().join("a"),
            dir.path().join("b"),
            dir.path().join("c"),
        );
        std::fs::write(&a, b"old a").unwrap();
        std::fs::write(&c, b"old c").unwrap();
        let sim = SimDisk::new(dir.path());
        let fb = sim.open_append(&b).unwrap();
        sim.sync_dir(dir.path()).unwrap();
        sim.write(&fb, b"unflushed").unwrap();
        sim.remove(&a).unwrap();
        let fc = sim.open_write(&c).unwrap();
        sim.truncate(&fc, 0).unwrap();
        std::fs::rename(&c, dir.path().join("d")).unwrap();
        sim.power_loss(Cut::None);
        assert_eq!(read(&b).unwrap(), b"", "name durable, data not");
        assert_eq!(read(&a).unwrap(), b"old a", "removal not flushed");
        assert_eq!(read(&c).unwrap(), b"old c", "truncation not flushed");
        assert_eq!(read(&dir.path().join("d")), None, "rename not flushed");
    }

    /// A dir whose creation was not flushed into its parent is lost with
    /// everything in it, flushed or not; flushed, it stays.
    #[test]
    fn a_dir_not_flushed_into_its_parent_is_lost() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a/x"), dir.path().join("b/x"));
        let sim = SimDisk::new(dir.path());
        for p in [&a, &b] {
            std::fs::create_dir(p.parent().unwrap()).unwrap();
            let f = sim.create_new(p, 0o600).unwrap();
            sim.write(&f, b"data").unwrap();
            sim.sync_all(&f).unwrap();
            sim.sync_dir(p.parent().unwrap()).unwrap();
        }
        sim.sync_dir(dir.path()).unwrap();
        // `a` and `b` are flushed into the root; `c`, made after, is not
        // (what it holds is).
        std::fs::create_dir(dir.path().join("c")).unwrap();
        let c = dir.path().join("c/x");
        let f = sim.create_new(&c, 0o600).unwrap();
        sim.sync_all(&f).unwrap();
        sim.sync_dir(&dir.path().join("c")).unwrap();
        sim.power_loss(Cut::None);
        assert_eq!(read(&a).unwrap(), b"data");
        assert_eq!(read(&b).unwrap(), b"data");
        assert!(
            !dir.path().join("c").exists(),
            "its creation was not flushed"
        );
    }

    /// An unflushed append is lost, cut short or kept whole, as [`Cut`]
    /// says; the flushed part is always there.
    #[test]
    fn unflushed_appends_are_lost_or_cut_short() {
        for (cut, want) in [
            (Cut::None, &b"synced\n"[..]),
            (Cut::Half, b"synced\nabc"),
            (Cut::All, b"synced\nabcdef\n"),
        ] {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("j");
            let sim = SimDisk::new(dir.path());
            let f = sim.open_append(&p).unwrap();
            sim.write(&f, b"synced\n").unwrap();
            sim.sync_all(&f).unwrap();
            sim.sync_dir(dir.path()).unwrap();
            sim.write(&f, b"abcdef\n").unwrap();
            sim.power_loss(cut);
            assert_eq!(read(&p).unwrap(), want, "{cut:?}");
        }
    }

    /// An atomic write is five I/O points; crashed between them, a
    /// process crash leaves the old file (and a temp file) or the new one,
    /// and a power loss the new one only once the dir was fsynced.
    #[test]
    fn an_atomic_write_is_five_points() {
        let mut seen = Vec::new();
        for n in 0..=5 {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("x");
            std::fs::write(&p, b"old").unwrap();
            let sim = SimDisk::new(dir.path()).crash_at(n);
            let done = durable::write_atomic_on(&sim, &p, b"new", 0o600, true).is_ok();
            assert_eq!(done, n == 5);
            let temps = std::fs::read_dir(dir.path()).unwrap().count() - 1;
            let crashed = read(&p).unwrap();
            sim.power_loss(Cut::None);
            let after_power_loss = read(&p).unwrap();
            seen.push((crashed, temps, after_power_loss));
        }
        let old = b"old".to_vec();
        let new = b"new".to_vec();
        assert_eq!(
            seen,
            [
                (old.clone(), 0, old.clone()),
                (old.clone(), 1, old.clone()),
                (old.clone(), 1, old.clone()),
                (old.clone(), 1, old.clone()),
                (new.clone(), 0, old.clone()),
                (new.clone(), 0, new.clone()),
            ]
        );
    }

    /// A fork is the same disk elsewhere: the same files, and a power
    /// loss on it keeps what one on the original would.
    #[test]
    fn a_fork_keeps_what_is_durable() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        std::fs::write(a.path().join("old"), b"old").unwrap();
        let sim = SimDisk::new(a.path());
        // Replaced by a rename not flushed; a new file not flushed.
        let tmp = a.path().join("tmp");
        let f = sim.create_new(&tmp, 0o600).unwrap();
        sim.write(&f, b"new").unwrap();
        sim.sync_data(&f).unwrap();
        sim.rename(&tmp, &a.path().join("old")).unwrap();
        let f = sim.open_append(&a.path().join("unflushed")).unwrap();
        sim.write(&f, b"lost").unwrap();
        // A dir and a file in it, flushed, and a tail that is not.
        std::fs::create_dir(a.path().join("d")).unwrap();
        let g = sim.create_new(&a.path().join("d/x"), 0o600).unwrap();
        sim.write(&g, b"flushed").unwrap();
        sim.sync_all(&g).unwrap();
        sim.sync_dir(&a.path().join("d")).unwrap();
        let fork = sim.fork(b.path());
        assert_eq!(read(&b.path().join("old")).unwrap(), b"new");
        assert!(!fork.dead() && fork.calls().is_empty());
        sim.write(&g, b", and a tail").unwrap();
        fork.write(
            &File::options()
                .append(true)
                .open(b.path().join("d/x"))
                .unwrap(),
            b", and a tail",
        )
        .unwrap();
        fork.power_loss(Cut::None);
        sim.power_loss(Cut::None);
        for (name, want) in [
            ("old", Some(&b"old"[..])),
            ("unflushed", None),
            ("d/x", None),
        ] {
            assert_eq!(read(&a.path().join(name)).as_deref(), want, "{name}");
            assert_eq!(read(&b.path().join(name)).as_deref(), want, "{name}");
        }
        // Flushed into the root, `d` stays, with its file's flushed part.
        for (sim, root) in [(&sim, a.path()), (&fork, b.path())] {
            std::fs::create_dir(root.join("d")).unwrap();
            let g = sim.create_new(&root.join("d/x"), 0o600).unwrap();
            sim.write(&g, b"flushed").unwrap();
            sim.sync_all(&g).unwrap();
            sim.sync_dir(&root.join("d")).unwrap();
            sim.sync_dir(root).unwrap();
        }
        let again = tempfile::tempdir().unwrap();
        let fork = fork.fork(again.path());
        fork.power_loss(Cut::None);
        assert_eq!(read(&again.path().join("d/x")).unwrap(), b"flushed");
        assert_eq!(read(&again.path().join("old")).unwrap(), b"old");
    }

    /// A `syncfs` of a dir makes everything under it durable as it is
    /// then, data, names and dirs, removals too; and nothing else: not
    /// the dir's own entry in its parent (a dir made and never flushed
    /// into its parent is lost with what it holds), not what is beside it.
    #[test]
    fn a_sync_fs_makes_the_dir_it_names_durable_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir(root.join("d")).unwrap();
        std::fs::write(root.join("d/old"), b"old").unwrap();
        let sim = SimDisk::new(root);
        let write = |p: &Path, bytes: &[u8]| {
            let f = sim.create_new(p, 0o600).unwrap();
            sim.write(&f, bytes).unwrap();
        };
        write(&root.join("d/a"), b"a");
        std::fs::create_dir(root.join("d/e")).unwrap();
        write(&root.join("d/e/b"), b"b");
        sim.remove(&root.join("d/old")).unwrap();
        write(&root.join("beside"), b"c");
        std::fs::create_dir(root.join("x")).unwrap();
        write(&root.join("x/f"), b"f");
        sim.sync_fs(&root.join("d")).unwrap();
        sim.sync_fs(&root.join("x")).unwrap();
        assert!(sim.sync_fs(&root.join("d/a")).is_err(), "not a dir");
        assert_eq!(sim.calls().iter().filter(|c| c.kind == "syncfs").count(), 3);
        sim.power_loss(Cut::None);
        assert_eq!(read(&root.join("d/a")).unwrap(), b"a");
        assert_eq!(read(&root.join("d/e/b")).unwrap(), b"b");
        assert_eq!(read(&root.join("d/old")), None, "the removal flushed");
        assert_eq!(read(&root.join("beside")), None, "beside the dir");
        assert!(!root.join("x").exists(), "its own entry not flushed");
    }

    /// A failure (not a crash) does nothing and the process goes on.
    #[test]
    fn an_injected_failure_is_not_a_crash() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let sim = SimDisk::new(dir.path()).fail_at(1);
        let f = sim.open_append(&p).unwrap();
        let e = sim.write(&f, b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::ENOSPC));
        assert!(!sim.dead());
        sim.write(&f, b"y").unwrap();
        assert_eq!(read(&p).unwrap(), b"y");
    }
}
