//! Listing the cached attachments, a page at a time. Every file is read
//! by the one reader of listed records (`listed.rs`).

use cni_core::cache::CacheRecord;

use super::listed::{names_container, read_listed};
use super::{Store, io_err};
use crate::error::Error;

/// Which part of the cache [`crate::cache::ResultCache::list_page`] reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListPage {
    /// Only file names sorting after this one (byte-wise).
    pub after: Option<String>,
    /// Records at most.
    pub limit: usize,
    /// Bytes of record files at most (the first record comes regardless).
    pub max_bytes: u64,
}

impl ListPage {
    /// Everything.
    pub const ALL: ListPage = ListPage {
        after: None,
        limit: usize::MAX,
        max_bytes: u64::MAX,
    };
}

impl Store {
    /// One page of the records (see
    /// [`crate::cache::ResultCache::list_page`]), from a listing of
    /// `results/`.
    pub(crate) fn list_page(
        &self,
        container_id: Option<&str>,
        page: &ListPage,
    ) -> Result<(Vec<CacheRecord>, Option<String>), Error> {
        let results = self.results_dir();
        let entries = match std::fs::read_dir(&results) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), None)),
            Err(e) => return Err(io_err(&results, "read directory", e)),
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| !n.starts_with('.'))
            .filter(|n| page.after.as_deref().is_none_or(|a| n.as_str() > a))
            .filter(|n| container_id.is_none_or(|cid| names_container(n, cid)))
            .collect();
        names.sort();
        let mut names = names.into_iter();
        Ok(self.page_from(container_id, page, |_, n| names.by_ref().take(n).collect()))
    }

    /// One page, as [`Store::list_page`] gives it, of the records named by
    /// `names(after, n)`: up to `n` file names sorting after `after` (from
    /// the first when `None`), in byte order, pre-filtered by container
    /// (for example [`super::RecordScan::names_after`] of a current scan).
    /// `names` is called again after the last name it gave while the page
    /// has room, so a page takes about a page's names, not the whole
    /// cache's: a full paging is linear in the cache's size. The second
    /// value is the file name to continue after, when names are left.
    pub(crate) fn page_from(
        &self,
        container_id: Option<&str>,
        page: &ListPage,
        mut names: impl FnMut(Option<&str>, usize) -> Vec<String>,
    ) -> (Vec<CacheRecord>, Option<String>) {
        let results = self.results_dir();
        let chunk = page.limit.clamp(1, 1024).saturating_add(1);
        let mut out = Vec::new();
        let mut page_bytes = 0u64;
        let mut last: Option<String> = None;
        loop {
            let taken = names(last.as_deref().or(page.after.as_deref()), chunk);
            if taken.is_empty() {
                return (out, None);
            }
            for name in taken {
                if out.len() >= page.limit {
                    return (out, last);
                }
                if page.max_bytes < u64::MAX {
                    let size =
                        std::fs::symlink_metadata(results.join(&name)).map_or(0, |m| m.len());
                    if !out.is_empty() && page_bytes.saturating_add(size) > page.max_bytes {
                        return (out, last);
                    }
                    page_bytes = page_bytes.saturating_add(size);
                }
                if let Some(listed) = read_listed(&results, &name)
                    && container_id.is_none_or(|c| c == listed.record.container_id)
                {
                    out.push(listed.record);
                }
                last = Some(name);
            }
        }
    }
}
