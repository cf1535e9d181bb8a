//! Adopting a batch another process set up: [`BatchBuilder::adopt`].

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cni_core::cache::CacheRecord;
use cni_core::validate;

use super::*;
use crate::Error;
use crate::netns::{NETNS_RUN_DIR, Netns, NetnsGuard};

impl BatchBuilder {
    /// Adopts the batch with this builder's prefix that another process
    /// set up and left ([`Batch::keep`], a killed harness), for
    /// [`Batch::teardown`]. The members are every namespace
    /// `PREFIX<number>` in `/run/netns` (a prefix must not end with a
    /// digit: `t` must not claim `t1`'s `t10`), and every cached attachment
    /// on one of the batch's networks (those of the [sandbox
    /// template](Self::sandbox_template), or else the `MultiNetwork`'s)
    /// whose netns is such a path and whose container ID is the member's,
    /// also when that namespace is gone. `count` is ignored.
    ///
    /// Teardown DELs each member's cached attachments with the arguments
    /// (and, for a network the `MultiNetwork` does not have, the
    /// configuration) cached at ADD; a namespace without any is removed as
    /// the sandbox template describes it. An adopted namespace whose DELs
    /// failed is kept, so that adopting it again retries.
    ///
    /// Fails when namespaces `PREFIX<number>` exist but nothing ties them
    /// to the batch (a mistyped network name must not delete another
    /// batch), when the prefix is invalid, or `/run/netns` or the cache
    /// cannot be read.
    pub async fn adopt(self) -> Result<Batch, Error> {
        if self.prefix.ends_with(|c: char| c.is_ascii_digit()) {
            return Err(Error::NetnsName {
                name: self.prefix,
                reason: "a batch prefix must not end with a digit",
            });
        }
        let id_of = self.id_of();
        let networks: Vec<String> = if self.template.networks.is_empty() {
            self.multi
                .networks()
                .iter()
                .map(|n| n.name().to_owned())
                .collect()
        } else {
            self.template
                .networks
                .iter()
                .map(|r| r.network.clone())
                .collect()
        };
        let prefix = self.prefix.clone();
        let names = tokio::task::spawn_blocking(move || existing_namespaces(&prefix))
            .await
            .map_err(|join| lost_task(PathBuf::from(NETNS_RUN_DIR), "list", join))??;

        // By (length, name): `P2` before `P10`.
        let mut found: BTreeMap<(usize, String), (bool, Vec<CacheRecord>)> = names
            .iter()
            .map(|n| ((n.len(), n.clone()), (true, Vec::new())))
            .collect();
        let mut cached = 0usize;
        for rec in self.multi.cni().cached_attachments(None).await? {
            let Some(name) = rec
                .netns
                .strip_prefix(NETNS_RUN_DIR)
                .and_then(|n| n.strip_prefix('/'))
            else {
                continue;
            };
            if !is_member(&self.prefix, name)
                || !networks.contains(&rec.network_name)
                || rec.container_id != id_of(name)
            {
                continue;
            }
            cached += 1;
            found
                .entry((name.len(), name.to_owned()))
                .or_insert_with(|| (false, Vec::new()))
                .1
                .push(rec);
        }
        if cached == 0 && !names.is_empty() && networks.iter().all(|n| self.multi.find(n).is_none())
        {
            return Err(Error::Core(cni_core::Error::InvalidParameter {
                field: "prefix",
                value: self.prefix,
                reason: format!(
                    "{} network namespaces with this prefix exist ({}), but network(s) {} have                      neither a configuration nor cached attachments in them",
                    names.len(),
                    name_list(&names),
                    networks
                        .iter()
                        .map(|n| format!("{n:?}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                code: cni_core::error::code::INVALID_NETWORK_CONFIG,
            }));
        }

        let mut members = Vec::with_capacity(found.len());
        for (index, ((_, name), (listed, cached))) in found.into_iter().enumerate() {
            let id = id_of(&name);
            validate::container_id(&id)?;
            let mut member = BatchMember::new(index, name, id);
            member.attempted = true;
            let mut stale_name = false;
            if listed {
                let open = member.name.clone();
                match tokio::task::spawn_blocking(move || Netns::open_named(&open)).await {
                    Ok(Ok(ns)) => member.netns = Some(NetnsGuard::new(ns)),
                    // Gone meanwhile: nothing to delete.
                    Ok(Err(Error::Netns { source, .. }))
                        if source.kind() == io::ErrorKind::NotFound => {}
                    // Not a namespace (an empty file): deleted by name.
                    Ok(Err(_)) => stale_name = true,
                    Err(join) => return Err(lost_task(member.path(), "open", join)),
                }
            }
            member.adopted = Some(Adopted { cached, stale_name });
            members.push(member);
        }
        let job = self.into_job(members.len(), false);
        Ok(Batch {
            job,
            members,
            setup_elapsed: Duration::ZERO,
            stopped: false,
        })
    }
}

/// The namespaces `PREFIX<number>` in `/run/netns`, by number (`P2`
/// before `P10`): the names a batch with this prefix owns
/// ([`BatchBuilder::adopt`] adopts them).
pub fn existing_namespaces(prefix: &str) -> Result<Vec<String>, Error> {
    let mut names: Vec<String> = Netns::list_named()?
        .into_iter()
        .filter(|n| is_member(prefix, n))
        .collect();
    names.sort_by_key(|n| (n.len(), n.clone()));
    Ok(names)
}

/// Whether `name` is `prefix` followed by one or more digits.
pub(super) fn is_member(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

/// Names as batch errors list them: the first five, then how many more
/// (`a, b, c, d, e and 4 more`).
pub fn name_list(names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut text = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        text.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    text
}

/// `/run/netns/NAME`, as a string (what `CNI_NETNS` gets).
pub(super) fn member_path(name: &str) -> String {
    Path::new(NETNS_RUN_DIR).join(name).display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_prefix_and_digits_and_long_name_lists_are_cut() {
        assert!(is_member("t-", "t-0"));
        assert!(is_member("t-", "t-123"));
        assert!(!is_member("t-", "t-"));
        assert!(!is_member("t-", "t-1a"));
        assert!(!is_member("t-", "tt-1"));
        let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        assert_eq!(name_list(&names[..2]), "n0, n1");
        assert_eq!(name_list(&names), "n0, n1, n2, n3, n4 and 3 more");
    }
}
