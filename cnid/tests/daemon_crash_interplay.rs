//! Attacks on how three changes meet after a `kill -9`: the orphans a
//! killed daemon left (waited for at the next start, issue 27), the netns
//! owners and their claims (issue 22), and the ADD journal kept across
//! starts when a record cannot be restored (issue 21).
//!
//! The network is one fake plugin, `atk`, that "allocates" a file per
//! container in `data/resources` on ADD and frees it on DEL; an ADD (DEL)
//! of container C blocks at the test's ADD (DEL) gate while the file
//! `data/hang-add-C` (`data/hang-del-C`) exists. A "reboot" is simulated as
//! `daemon_commit.rs` does: the journal's commit lines get another boot id
//! and the cache file is lost.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::daemon::{Daemon, Dirs, eventually, kill_group, post};
use crate::support::gate::Gate;
use crate::support::require_root;
use serde_json::{Value, json};

const NET: &str = "interplay";
/// What cnid logs when it found orphans and waits for them.
const WAITING: &str = "waiting for orphaned plugins";

struct Net {
    dirs: Dirs,
    add_gate: Gate,
    del_gate: Gate,
    resources: PathBuf,
}

impl Net {
    fn new() -> Net {
        let dirs = Dirs::new();
        let resources = dirs.data.join("resources");
        fs::create_dir_all(&resources).expect("create resources dir");
        let add_gate = Gate::new(dirs.root());
        let del_gate = Gate::new(dirs.root());
        dirs.plugin(
            "atk",
            &format!(
                r#"cat > /dev/null
case "$CNI_COMMAND" in
ADD)
  echo $$ > {data}/add-"$CNI_CONTAINERID".pid
  if [ -e {data}/hang-add-"$CNI_CONTAINERID" ]; then
{add_wait}
  fi
  touch {res}/"$CNI_CONTAINERID"
  echo '{{"cniVersion":"1.0.0","ips":[{{"address":"10.97.0.5/24"}}]}}';;
DEL)
  if [ -e {data}/hang-del-"$CNI_CONTAINERID" ]; then
{del_wait}
  fi
  rm -f {res}/"$CNI_CONTAINERID";;
VERSION) echo '{{"cniVersion":"1.0.0","supportedVersions":["1.0.0"]}}';;
esac"#,
                data = dirs.data.display(),
                res = resources.display(),
                add_wait = add_gate.shell_wait(),
                del_wait = del_gate.shell_wait(),
            ),
        );
        dirs.conf(
            "10-interplay.conflist",
            &json!({"cniVersion": "1.0.0", "name": NET, "plugins": [{"type": "atk"}]}),
        );
        Net {
            dirs,
            add_gate,
            del_gate,
            resources,
        }
    }

    fn hang(&self, verb: &str, cid: &str) {
        fs::write(self.dirs.data.join(format!("hang-{verb}-{cid}")), b"").unwrap();
    }

    /// The pid (and process group) of the last ADD plugin run of `cid`.
    fn add_pid(&self, cid: &str) -> i32 {
        let path = self.dirs.data.join(format!("add-{cid}.pid"));
        let mut pid = 0;
        eventually(Duration::from_secs(30), "the ADD plugin's pid", || {
            pid = fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            pid > 0
        });
        pid
    }

    fn resources(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(&self.resources)
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    fn cache_file(&self, cid: &str) -> PathBuf {
        self.dirs.cache.join(format!("results/{NET}-{cid}-eth0"))
    }

    /// ADD of `cid` on `netns` (eth0) through `socket`, in a thread: the
    /// status and the answer.
    fn add_in_thread(
        &self,
        socket: &Path,
        cid: &str,
        netns: &str,
    ) -> std::thread::JoinHandle<(u16, Value)> {
        let socket = socket.to_owned();
        let body = att(cid, netns);
        std::thread::spawn(move || call(&socket, "add", &body))
    }
}

fn att(cid: &str, netns: &str) -> Value {
    json!({"containerId": cid, "netns": netns, "ifname": "eth0"})
}

/// POSTs to `/v1/networks/interplay/{verb}`: the status and the answer.
fn call(socket: &Path, verb: &str, body: &Value) -> (u16, Value) {
    let raw = post(
        socket,
        &format!("/v1/networks/{NET}/{verb}"),
        &body.to_string(),
    );
    let v = if raw.body.is_empty() {
        Value::Null
    } else {
        raw.json()
    };
    (raw.status, v)
}

/// Kills a process group on drop (an orphan the test left).
struct Group(i32);

impl Drop for Group {
    fn drop(&mut self) {
        kill_group(self.0);
    }
}

/// Found by this attack: the rollback of an unfinished ADD, queued at
/// start, claimed nothing. Another container's ADD on the same netns and
/// ifname was admitted while that rollback ran (no record, no claim), and
/// the two ran at once on one interface: the rollback's DEL tears down
/// whatever is at that netns and ifname, which may be the new ADD's
/// interface. The rollback now claims its netns and ifname as any
/// admitted operation does: the other ADD gets 409 until it is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recovery_rollback_claims_its_netns_and_ifname() {
    require_root!();
    let net = Net::new();
    let netns = net.dirs.netns("shared");
    let mut daemon = Daemon::start(&net.dirs, &[]);
    net.hang("add", "c-1");
    let add = net.add_in_thread(&daemon.socket, "c-1", &netns);
    net.add_gate.wait_started(1).await;
    let plugin = Group(net.add_pid("c-1"));
    daemon.kill9();
    drop(plugin); // no orphan: the rollback is queued at once
    let _ = add.join();
    assert_eq!(net.dirs.intents(), ["interplay:c-1:eth0.json"]);

    // The restart rolls c-1 back; its DEL blocks.
    net.hang("del", "c-1");
    let daemon = Daemon::start(&net.dirs, &[]);
    net.del_gate.wait_started(1).await;

    // Meanwhile another container asks for the same netns and ifname.
    let (status, answer) = call(&daemon.socket, "add", &att("c-2", &netns));
    assert_eq!(
        status, 409,
        "admitted while c-1's rollback runs on that netns and ifname: {answer}\n{}",
        daemon.log()
    );
    let msg = answer["msg"].as_str().unwrap_or_default();
    assert!(msg.contains("\"c-1\""), "{msg}");

    net.del_gate.release();
    eventually(Duration::from_secs(30), "the rollback", || {
        net.dirs.intents().is_empty()
    });
    eventually(Duration::from_secs(30), "the rollback logged", || {
        daemon.log().contains("unfinished ADD rolled back")
    });
    // Free once it is done.
    let (status, answer) = call(&daemon.socket, "add", &att("c-2", &netns));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(net.resources(), ["c-2"]);
}
