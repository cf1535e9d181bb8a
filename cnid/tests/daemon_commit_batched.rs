//! Adversarial tests of cnid's batched start-up flush (one `syncfs`
//! rather than 10,000 `fsync`s at node scale): from 64
//! commit lines of this boot on, a start makes their records durable in
//! one `syncfs` of the cache's file system, not an `fsync` each. These
//! tests drive a real cnid with a fake allocating plugin (a file per
//! attachment in `data/alloc`, made by ADD, removed by DEL), take it down
//! with `kill -9` so the commit lines stay, and check what the next start
//! leaves: the journal emptied once the records are durable, every
//! answered ADD's record kept (the DEL gets its `prevResult`), nothing a
//! DEL removed back, no allocation without a record.
//!
//! # Caveats
//!
//! A real disk cannot lose what was not flushed: what a power loss would
//! drop is modelled by the simulated disk (`cnid/src/daemon/intents/
//! tests/crash_points.rs`, `recover.rs`); here only the journal's lines and the
//! files the cache holds are checked.

use crate::support;
use crate::support::daemon::{Daemon, Dirs};
use cnid::api::AttachmentRequest;
use serde_json::{Value, json};

const NET: &str = "dbatched";

/// From how many records a start flushes in one `syncfs`
/// (`cnid/src/daemon/intents/mod.rs`, `SYNC_FS_AT`).
const SYNC_FS_AT: usize = 64;

/// The commit lines of the journal.
fn commit_lines(dirs: &Dirs) -> usize {
    std::fs::read(dirs.state.join("intents/journal"))
        .unwrap_or_default()
        .split(|b| *b == b'\n')
        .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
        .filter(|v| v.get("record").is_some())
        .count()
}

/// The plugin's allocations, by container ID.
fn allocations(dirs: &Dirs) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dirs.data.join("alloc"))
        .map(|rd| {
            rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// A plugin that allocates a file per attachment on ADD, removes it on
/// DEL and keeps the `prevResult` each DEL got in `data/prev/<id>`.
fn network(dirs: &Dirs) {
    let (alloc, prev) = (dirs.data.join("alloc"), dirs.data.join("prev"));
    std::fs::create_dir_all(&alloc).unwrap();
    std::fs::create_dir_all(&prev).unwrap();
    dirs.plugin(
        "alloc",
        &format!(
            r#"in=$(cat)
case "$CNI_COMMAND" in
ADD) : > {alloc}/$CNI_CONTAINERID
     printf '{{"cniVersion":"1.0.0","ips":[{{"address":"10.97.0.7/24"}}]}}';;
DEL) printf '%s' "$in" > {prev}/$CNI_CONTAINERID; rm -f {alloc}/$CNI_CONTAINERID;;
VERSION) printf '{{"cniVersion":"1.1.0","supportedVersions":["1.0.0","1.1.0"]}}';;
esac
exit 0"#,
            alloc = alloc.display(),
            prev = prev.display()
        ),
    );
    dirs.conf(
        "10-batched.conflist",
        &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "alloc"}]}),
    );
}

fn request(dirs: &Dirs, i: usize) -> AttachmentRequest {
    let cid = format!("b-{i:03}");
    AttachmentRequest::new(&cid, dirs.netns(&cid), "eth0")
}

/// `n` ADDs answered, then `kill -9`: `n` commit lines left in the journal.
async fn killed_after_adds(dirs: &Dirs, n: usize) {
    let mut daemon = Daemon::start(dirs, &[]);
    let client = daemon.client().await;
    for i in 0..n {
        client.add(NET, &request(dirs, i)).await.expect("ADD");
    }
    daemon.kill9();
    assert_eq!(commit_lines(dirs), n, "commit lines before the restart");
}

/// DELs every attachment left in `0..n` and checks that each got its
/// ADD's result as `prevResult` and that no allocation is left.
async fn del_all(dirs: &Dirs, daemon: &Daemon, n: usize, skip: &[usize]) {
    let client = daemon.client().await;
    for i in (0..n).filter(|i| !skip.contains(i)) {
        let req = request(dirs, i);
        client.del(NET, &req).await.expect("DEL");
        let stdin: Value = serde_json::from_slice(
            &std::fs::read(dirs.data.join("prev").join(&req.container_id)).unwrap(),
        )
        .unwrap();
        assert_eq!(
            stdin["prevResult"]["ips"][0]["address"], "10.97.0.7/24",
            "{}: {stdin}",
            req.container_id
        );
    }
    assert!(allocations(dirs).is_empty(), "{:?}", allocations(dirs));
    assert!(dirs.cached().is_empty(), "{:?}", dirs.cached());
}

/// Defect: a cache whose `results/` is a
/// symbolic link to a dir (which the cache accepts and uses: its dirs
/// are made and checked through links) had its records flushed file by
/// file below 64 commit lines, but from 64 on the start's one `syncfs`
/// opened `results/` with `O_NOFOLLOW`, failed (`ELOOP`), and every line
/// was carried to the next start, and the next, the journal never
/// emptied at a start or a graceful exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_symlinked_results_dir_does_not_keep_the_lines_of_a_batched_start() {
    support::require_root!();
    let dirs = Dirs::new();
    network(&dirs);
    let real = dirs.data.join("results-elsewhere");
    std::fs::create_dir_all(&real).unwrap();
    std::fs::create_dir_all(&dirs.cache).unwrap();
    std::os::unix::fs::symlink(&real, dirs.cache.join("results")).unwrap();
    killed_after_adds(&dirs, SYNC_FS_AT).await;
    assert_eq!(std::fs::read_dir(&real).unwrap().count(), SYNC_FS_AT);

    let daemon = Daemon::start(&dirs, &[]);
    assert_eq!(
        commit_lines(&dirs),
        0,
        "the start flushed the records and dropped no line: {}",
        daemon.log()
    );
    del_all(&dirs, &daemon, SYNC_FS_AT, &[]).await;
}

/// At and around the threshold (63, 64, 65 lines), after a `kill -9`, with
/// records removed by another tool before the start (a DEL through the
/// shared cache writes no `gone` line in cnid's journal): the start
/// empties the journal, restores nothing removed in the same boot, and
/// every attachment left DELs with its `prevResult`, freeing every
/// allocation the plugin made for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_around_the_batched_threshold_keeps_every_record_and_restores_no_removed_one() {
    support::require_root!();
    for n in [SYNC_FS_AT - 1, SYNC_FS_AT, SYNC_FS_AT + 1] {
        let dirs = Dirs::new();
        network(&dirs);
        killed_after_adds(&dirs, n).await;
        assert_eq!(allocations(&dirs).len(), n);
        // Another tool DELs two of them meanwhile: its plugin run and the
        // record's removal, as libcni does.
        let removed = [0, n - 1];
        for &i in &removed {
            let cid = request(&dirs, i).container_id;
            std::fs::remove_file(dirs.cache.join(format!("results/{NET}-{cid}-eth0"))).unwrap();
            std::fs::remove_file(dirs.data.join("alloc").join(&cid)).unwrap();
        }

        let mut daemon = Daemon::start(&dirs, &[]);
        assert_eq!(commit_lines(&dirs), 0, "{n} lines: {}", daemon.log());
        assert_eq!(dirs.cached().len(), n - removed.len(), "{n} lines");
        // A second start in the same boot (kill -9 right after the
        // first) finds nothing to do and brings nothing back.
        daemon.kill9();
        let daemon = Daemon::start(&dirs, &[]);
        assert_eq!(dirs.cached().len(), n - removed.len(), "{n} lines");
        assert!(dirs.intents().is_empty(), "{:?}", dirs.intents());
        del_all(&dirs, &daemon, n, &removed).await;
        assert_eq!(commit_lines(&dirs), 0);
    }
}

/// An ext4 file system on a loop device whose image lives on a small
/// tmpfs, its free blocks punched out of the image: once the tmpfs is
/// [`FailingDisk::fill`]ed, every write-back of new data to it fails
/// (`ENOSPC` from the loop device), as a dying or thin-provisioned disk
/// fails it, while its metadata (journal, inode tables, the dirs made
/// before) still writes. [`FailingDisk::power_loss`] drops what was not
/// written back: unmount, detach, attach, mount.
struct FailingDisk {
    tmpfs: std::path::PathBuf,
    mount: std::path::PathBuf,
    loop_dev: String,
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = std::process::Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl FailingDisk {
    /// Its image in a tmpfs mounted on `work`, mounted on `mount`, with
    /// `dirs` made on it.
    fn new(work: &std::path::Path, mount: &std::path::Path, dirs: &[&str]) -> FailingDisk {
        use std::os::unix::fs::FileExt;
        let tmpfs = work.to_owned();
        let mount = mount.to_owned();
        std::fs::create_dir_all(&tmpfs).unwrap();
        std::fs::create_dir_all(&mount).unwrap();
        run(
            "mount",
            &[
                "-t",
                "tmpfs",
                "-o",
                "size=48m",
                "tmpfs",
                tmpfs.to_str().unwrap(),
            ],
        );
        let img = tmpfs.join("img");
        let t = img.to_str().unwrap();
        std::fs::write(&img, vec![0x5a; 32 << 20]).unwrap();
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-b",
                "4096",
                "-O",
                "^inline_data",
                "-E",
                "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
                t,
            ],
        );
        let mut disk = FailingDisk {
            tmpfs,
            mount,
            loop_dev: String::new(),
        };
        disk.attach();
        for d in dirs {
            std::fs::create_dir_all(disk.mount.join(d)).unwrap();
        }
        run("sync", &["-f", disk.mount.to_str().unwrap()]);
        disk.detach();
        // mkfs zeroed its tables with holes: make them real, then punch
        // the free blocks only.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&img)
            .unwrap();
        let mut buf = vec![0; 1 << 20];
        for off in (0..(32u64 << 20)).step_by(1 << 20) {
            f.read_exact_at(&mut buf, off).unwrap();
            f.write_all_at(&buf, off).unwrap();
        }
        let dump = run("dumpe2fs", &[t]);
        for line in dump
            .lines()
            .filter_map(|l| l.strip_prefix("  Free blocks: "))
        {
            for range in line.split(',').map(str::trim).filter(|r| !r.is_empty()) {
                let (a, b) = range.split_once('-').unwrap_or((range, range));
                let (a, b): (i64, i64) = (a.parse().unwrap(), b.parse().unwrap());
                nix::fcntl::fallocate(
                    &f,
                    nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                        | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                    a * 4096,
                    (b - a + 1) * 4096,
                )
                .unwrap();
            }
        }
        drop(f);
        disk.attach();
        disk
    }

    fn attach(&mut self) {
        let img = self.tmpfs.join("img");
        self.loop_dev = run("losetup", &["-f", "--show", img.to_str().unwrap()])
            .trim()
            .to_owned();
        run(
            "mount",
            &["-t", "ext4", &self.loop_dev, self.mount.to_str().unwrap()],
        );
    }

    fn detach(&mut self) {
        run("umount", &[self.mount.to_str().unwrap()]);
        run("losetup", &["-d", &self.loop_dev]);
    }

    /// From now on, a write-back of new data fails.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.tmpfs.join("filler")).unwrap();
        let block = vec![0; 64 << 10];
        while f.write_all(&block).is_ok() {}
    }

    /// The machine goes down: what was not written back is lost; the
    /// disk writes again afterwards.
    fn power_loss(&mut self) {
        // Unmounting writes back what is dirty: fail it first, as the
        // power loss would.
        self.fill();
        let _ = std::process::Command::new("umount")
            .arg(&self.mount)
            .status();
        run("losetup", &["-d", &self.loop_dev]);
        std::fs::remove_file(self.tmpfs.join("filler")).unwrap();
        self.attach();
    }
}

impl Drop for FailingDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.mount)
            .status();
        let _ = std::process::Command::new("losetup")
            .args(["-d", &self.loop_dev])
            .status();
        let _ = std::process::Command::new("umount")
            .arg(&self.tmpfs)
            .status();
    }
}

/// The boot id in the journal's lines replaced, as after a reboot.
fn journal_of_another_boot(dirs: &Dirs) {
    let journal = dirs.state.join("intents/journal");
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let text = std::fs::read_to_string(&journal).unwrap_or_default();
    std::fs::write(&journal, text.replace(boot.trim(), "another-boot")).unwrap();
}

/// A cache on a disk whose write-back fails, `n` ADDs answered, `kill -9`.
async fn killed_on_a_failing_disk(dirs: &Dirs, n: usize) -> FailingDisk {
    network(dirs);
    let disk = FailingDisk::new(&dirs.data.join("tmpfs"), &dirs.cache, &["results", "locks"]);
    disk.fill();
    killed_after_adds(dirs, n).await;
    disk
}

/// After the power loss, the next start restores every record from the
/// lines kept: each DEL gets its `prevResult`, no allocation is left.
async fn every_record_back_after_a_power_loss(dirs: &Dirs, disk: &mut FailingDisk, n: usize) {
    disk.power_loss();
    journal_of_another_boot(dirs);
    let daemon = Daemon::start(dirs, &[]);
    assert_eq!(commit_lines(dirs), 0, "{}", daemon.log());
    del_all(dirs, &daemon, n, &[]).await;
}

/// Defect: `syncfs(2)` reports a write-back
/// error of its file system once, to the first caller that looks (the
/// superblock's `errseq`), while `fsync` reports a file's own to the
/// first `fsync` of that file. Another program's `syncfs` of the cache's
/// file system (`sync -f`, a package manager, a backup tool) after the
/// records' write-back failed took the error, cnid's start got `Ok`,
/// dropped every commit line, and the power loss took every record: 64
/// DELs without `prevResult` (file by file, below 64, the lines were
/// kept and the records restored).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batched_start_after_another_programs_syncfs_saw_the_write_back_error_keeps_the_lines() {
    support::require_root!();
    let dirs = Dirs::new();
    let mut disk = killed_on_a_failing_disk(&dirs, SYNC_FS_AT).await;
    let other = std::process::Command::new("sync")
        .arg("-f")
        .arg(&dirs.cache)
        .status()
        .unwrap();
    assert!(!other.success(), "the other program saw the error");

    let mut daemon = Daemon::start(&dirs, &[]);
    assert_eq!(
        commit_lines(&dirs),
        SYNC_FS_AT,
        "lines dropped for records never written: {}",
        daemon.log()
    );
    daemon.kill9();
    every_record_back_after_a_power_loss(&dirs, &mut disk, SYNC_FS_AT).await;
}

/// Defect: a start whose batched flush failed
/// kept the lines "for the next start"; but the failed write-back had
/// left the records' pages clean (their data lost) and the error taken,
/// so the next start's `syncfs` (the same boot, the disk still failing)
/// returned `Ok` and dropped every line: the power loss then took all 64
/// records. (File by file each start took one record's error, so the
/// lines were kept for 63 more starts: the same hole, narrower.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_after_a_failed_batched_flush_keeps_the_lines_until_the_records_are_written() {
    support::require_root!();
    let dirs = Dirs::new();
    let mut disk = killed_on_a_failing_disk(&dirs, SYNC_FS_AT).await;
    for start in 1..=2 {
        let mut daemon = Daemon::start(&dirs, &[]);
        assert_eq!(
            commit_lines(&dirs),
            SYNC_FS_AT,
            "start {start} dropped lines of records never written: {}",
            daemon.log()
        );
        daemon.kill9();
    }
    every_record_back_after_a_power_loss(&dirs, &mut disk, SYNC_FS_AT).await;
}
