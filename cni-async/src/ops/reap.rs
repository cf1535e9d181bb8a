//! The reap of a stale cached attachment ([`crate::stale`] finds them):
//! a DEL with the cached configuration, result and args and no netns path,
//! made only while the namespace is still proven gone and the record is
//! exactly the scanned one.

use cni_core::RuntimeConf;
use cni_core::cache::{CacheEntry, CacheRecord};

use super::{CallOptions, Cni};
use crate::error::Error;
use crate::stale::{Candidate, Host, Netns, Reaped, StaleReason, judge_one};

impl Cni {
    /// DELs a stale attachment `c` found by
    /// [`StaleScanner::scan`](crate::stale::StaleScanner::scan) as the
    /// [`stale`](crate::stale) module says, unless the record changed (is
    /// gone, or is not exactly the scanned one: mtime, netns, identity) or
    /// the namespace is no longer proven gone. A failed DEL leaves the
    /// record.
    pub async fn reap_stale(&self, c: &Candidate, opts: &CallOptions) -> Result<Reaped, Error> {
        let Some(reason) = c.verdict.stale() else {
            return Ok(Reaped::Alive);
        };
        let path = self.cache().path(&c.network, &c.container_id, &c.ifname)?;
        // The record as it is now must be the scanned one.
        let same_record = |r: &CacheRecord| {
            r.netns == c.netns
                && r.identity == c.identity
                && std::fs::symlink_metadata(&path)
                    .and_then(|m| m.modified())
                    .is_ok_and(|m| Some(m) == c.written)
        };
        match self
            .cache()
            .read(&c.network, &c.container_id, &c.ifname)
            .await?
        {
            Some(CacheEntry::Record(r)) if same_record(&r) => {}
            _ => return Ok(Reaped::Changed),
        }
        // Judged again: a namespace entered or opened since the scan is
        // not gone. The scan's clock (stale_after) is not rerun: only
        // whether the namespace is still proven gone.
        // A record without identity was dated by the scan (its mtime is
        // unchanged): no boot time, what is judged again is its path.
        let host = Host::now(None);
        let (netns, identity_, written) = (c.netns.clone(), c.identity.clone(), c.written);
        let (ns, earlier) = tokio::task::spawn_blocking(move || {
            judge_one(&netns, identity_.as_ref(), written, &host)
        })
        .await
        .unwrap_or((Netns::Unknown, false));
        let rebooted = earlier || c.identity.is_none();
        if ns != Netns::Gone || (reason == StaleReason::Rebooted && !rebooted) {
            return Ok(Reaped::Alive);
        }
        // Checked again under the attachment's lock: another tool's DEL
        // and re-ADD may have come in between.
        let rt = RuntimeConf::new(&c.container_id, "", &c.ifname);
        match self
            .del_cached_expecting(&c.network, &rt, opts, Some(&same_record))
            .await
        {
            Ok(_) => Ok(Reaped::Deleted),
            Err(e) if e.kind() == crate::ErrorKind::NotAttached => Ok(Reaped::Changed),
            Err(e) => Err(e),
        }
    }
}
