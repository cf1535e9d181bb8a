//! DEL: [`Cni::del_network_list`], [`Cni::del_network`], [`Cni::del_cached`],
//! [`DelRequest`].

use cni_core::cache::{CacheEntry, CacheRecord};
use cni_core::error::Chain;
use cni_core::validate::Escaped;
use cni_core::{Command, NetworkConfigList, PluginConfig, RuntimeConf};
use std::marker::PhantomData;

use tracing::Instrument;

use crate::cache::AttachmentLock;
use crate::error::Error;

use super::cached::result_of_entry;
use super::request::{Operation, Request};
use super::{CallOptions, Cni, Deadline, Net};

impl Cni {
    /// DEL: runs the plugins last to first with the cached result as
    /// `prevResult` (0.4.0 and later), then removes the cache entry. A
    /// cache it cannot use (no entry, a corrupt one, the dir unusable, the
    /// lock impossible) is no error: the plugins run all the same, without
    /// `prevResult` and unlocked where need be, and each such problem is a
    /// warning ([`DelRequest::with_outcome`]). Only a lock held by someone
    /// else stops it ([`Error::CacheLocked`]). Repeating a DEL is fine.
    pub fn del_network_list<'a>(
        &'a self,
        list: &'a NetworkConfigList,
        rt: &'a RuntimeConf,
    ) -> DelRequest<'a> {
        self.del_request(DelTarget::Net(Ok(Net::list(list))), rt)
    }

    /// DEL using the configuration stored in the cache entry of the
    /// attachment, for when the network's config has since been removed or
    /// changed (`docs/decisions.md` D10). The cached `CNI_ARGS` and
    /// capability args are used when `rt` has none. Errors with code 3 when
    /// there is no entry.
    pub fn del_cached<'a>(&'a self, network: &'a str, rt: &'a RuntimeConf) -> DelRequest<'a> {
        self.del_request(DelTarget::Cached(network), rt)
    }

    fn del_request<'a>(&'a self, target: DelTarget<'a>, rt: &'a RuntimeConf) -> DelRequest<'a> {
        Request::new(
            self,
            DelOp {
                target,
                rt,
                out: PhantomData,
            },
        )
    }

    /// [`Cni::del_cached`]; with `expect`, only while the cache holds a
    /// record `expect` accepts once the attachment's lock is taken (otherwise
    /// [`Error::NotAttached`], nothing run), and with `rt.netns` as given
    /// (empty: none): what a reap of a record scanned earlier needs
    /// ([`crate::stale`]).
    /// Answers what the DEL went past.
    pub(crate) async fn del_cached_expecting(
        &self,
        network: &str,
        rt: &RuntimeConf,
        opts: &CallOptions,
        expect: Option<&Expect<'_>>,
    ) -> Result<Deleted, Error> {
        let Some(CacheEntry::Record(rec)) = self.read_cached(network, rt, true).await? else {
            return Err(Error::not_attached(network, rt));
        };
        // The entry of a single-network ADD holds a plugin config, not a list.
        let mut list = NetworkConfigList::from_bytes(&rec.config, None)?;
        if list.plugins().is_empty() && !list.raw().contains_key("plugins") {
            list = NetworkConfigList::from_plugin(PluginConfig::from_bytes(&rec.config, None)?)?;
        }
        let mut rt = rt.clone();
        if rt.args.is_empty() {
            rt.args = rec.cni_args.clone();
        }
        if rt.capability_args.is_empty() {
            rt.capability_args = rec.capability_args.clone();
        }
        // A reap (`expect`) chose its netns: empty means none.
        if rt.netns.is_empty() && expect.is_none() {
            rt.netns = rec.netns.clone();
        }
        let deadline = self.deadline(Command::Del, opts);
        self.del_expecting(&Net::list(&list), &rt, deadline, None, expect)
            .await
    }

    /// DEL of a single plugin configuration, libcni's `DelNetwork`.
    pub fn del_network<'a>(
        &'a self,
        plugin: &'a PluginConfig,
        rt: &'a RuntimeConf,
    ) -> DelRequest<'a> {
        self.del_request(DelTarget::Net(Net::single(plugin)), rt)
    }

    /// DEL; with `held`, the attachment's lock already held (as a detached
    /// ADD's task holds it from the ADD to the DEL of a result nobody
    /// took); with `expect`, only while the cache holds a record it accepts
    /// once the lock is taken ([`Cni::del_cached_expecting`]). Answers the
    /// cache problems it went past ([`Deleted`]).
    pub(super) async fn del_expecting(
        &self,
        net: &Net<'_>,
        rt: &RuntimeConf,
        deadline: Deadline,
        held: Option<AttachmentLock>,
        expect: Option<&Expect<'_>>,
    ) -> Result<Deleted, Error> {
        self.validate_attachment(net, rt, Command::Del)?;
        let span = tracing::info_span!("cni.del", network = &*net.name, container = ?rt.container_id, ifname = ?rt.ifname);
        async {
            // DEL must work when things are already gone (spec), also when
            // the cache dir is unusable: unlocked and without prevResult
            // rather than not at all.
            let with_prev = net.version.has_prev_result_on_del();
            let cache = &self.inner.cache;
            let mut outcome = Deleted::default();
            let (cid, ifname, timeout) = (&rt.container_id, &rt.ifname, deadline.remaining());
            let locked = if let Some(lock) = held {
                Ok((lock, None))
            } else if with_prev || expect.is_some() {
                cache
                    .lock_and_read(&net.name, cid, ifname, timeout)
                    .await
                    .map(|(lock, read)| (lock, Some(read)))
            } else {
                cache.lock(&net.name, cid, ifname, timeout).await.map(|lock| (lock, None))
            };
            let (lock, read) = match locked {
                Ok((lock, read)) => (Some(lock), read),
                Err(e @ Error::Cache { .. }) => {
                    tracing::warn!(error = %Escaped(Chain(&e)), "cannot take the attachment lock; DEL runs unlocked");
                    outcome.cache_warnings.push(e);
                    (None, None)
                }
                Err(e) => return Err(e),
            };
            if let Some(expect) = expect {
                let same = matches!(&read, Some(Ok(Some(CacheEntry::Record(now)))) if expect(now));
                if lock.is_none() || !same {
                    return Err(Error::not_attached(&net.name, rt));
                }
            }
            let prev = if with_prev {
                let read = match read {
                    Some(read) => read,
                    None => cache.read(&net.name, cid, ifname).await,
                };
                read.and_then(|entry| result_of_entry(entry, net.version))
                    .unwrap_or_else(|e| {
                        tracing::warn!(error = %Escaped(Chain(&e)), "cached result unusable; DEL runs without prevResult");
                        outcome.cache_warnings.push(e);
                        None
                    })
                    .map(|r| r.to_value())
            } else {
                None
            };
            outcome.prev_result = prev.is_some();
            for plugin in net.plugins.iter().rev() {
                self.run_on_attachment(net, plugin, Command::Del, rt, prev.as_ref(), deadline)
                    .await?;
            }
            // The plugins are done: the attachment is gone. A cache entry we
            // cannot remove is stale, not an error of the DEL (a later DEL or
            // GC finds it again and repeats the harmless DEL).
            if let Err(e) = cache.remove(&net.name, cid, ifname).await {
                tracing::warn!(error = %Escaped(Chain(&e)), "DEL succeeded but its cache entry could not be removed");
                outcome.cache_warnings.push(e);
                return Ok(outcome);
            }
            if let Some(lock) = lock {
                lock.release_and_remove();
            }
            Ok(outcome)
        }
        .instrument(span)
        .await
    }
}

/// What a DEL expects of the record it finds under the lock
/// ([`Cni::del_cached_expecting`]).
pub(crate) type Expect<'a> = dyn Fn(&CacheRecord) -> bool + Send + Sync + 'a;

#[derive(Debug)]
enum DelTarget<'a> {
    Net(Result<Net<'a>, Error>),
    Cached(&'a str),
}

/// A DEL ready to run ([`Cni::del_network_list`], [`Cni::del_network`],
/// [`Cni::del_cached`]): `.await` it, after setting options if needed.
pub type DelRequest<'a> = Request<'a, DelOp<'a>>;

/// What a [`DelRequest`] runs; `Out` is what it answers: nothing, or with
/// [`DelRequest::with_outcome`] what the DEL went past ([`Deleted`]).
#[derive(Debug)]
pub struct DelOp<'a, Out = ()> {
    target: DelTarget<'a>,
    rt: &'a RuntimeConf,
    out: PhantomData<fn() -> Out>,
}

/// A successful DEL's account of the result cache
/// ([`DelRequest::with_outcome`]): the plugins ran and succeeded; these
/// say with what.
#[derive(Debug, Default)]
#[non_exhaustive]
pub struct Deleted {
    /// Whether the plugins got the cached result as `prevResult` (never for
    /// a network whose version has none on DEL, before 0.4.0).
    pub prev_result: bool,
    /// The cache problems the DEL went past, each also logged as a warning:
    /// the lock could not be taken, the record read or removed.
    pub cache_warnings: Vec<Error>,
}

impl<'a> DelRequest<'a> {
    /// Answers what the DEL went past in the result cache ([`Deleted`])
    /// instead of nothing, for a caller that reports it (cnitool prints
    /// the warnings; a runtime may count them).
    pub fn with_outcome(self) -> Request<'a, DelOp<'a, Deleted>> {
        let Request { cni, op, opts } = self;
        Request {
            cni,
            op: DelOp {
                target: op.target,
                rt: op.rt,
                out: PhantomData,
            },
            opts,
        }
    }
}

impl<'a, Out> DelOp<'a, Out> {
    async fn delete(self, cni: &'a Cni, opts: CallOptions) -> Result<Deleted, Error> {
        let in_op = |network: &str, e| {
            Error::in_operation(network, &self.rt.ifname, Command::Del, false, e)
        };
        match self.target {
            DelTarget::Net(net) => {
                let net = net?;
                let deadline = cni.deadline(Command::Del, &opts);
                cni.del_expecting(&net, self.rt, deadline, None, None)
                    .await
                    .map_err(|e| in_op(&net.name, e))
            }
            DelTarget::Cached(network) => cni
                .del_cached_expecting(network, self.rt, &opts, None)
                .await
                .map_err(|e| in_op(network, e)),
        }
    }
}

impl<'a> Operation<'a> for DelOp<'a> {
    type Output = ();

    async fn run(self, cni: &'a Cni, opts: CallOptions) -> Result<(), Error> {
        self.delete(cni, opts).await.map(drop)
    }
}

impl<'a> Operation<'a> for DelOp<'a, Deleted> {
    type Output = Deleted;

    async fn run(self, cni: &'a Cni, opts: CallOptions) -> Result<Deleted, Error> {
        self.delete(cni, opts).await
    }
}
