//! Intent files: `<state dir>/intents/<network>:<containerID>:<ifname>.json`,
//! one per ADD that failed and could not be rolled back (and, at start,
//! one per `begin` the journal held open).
//!
//! Invariants kept here: a file is written durably ([`durable::write_atomic`])
//! and read without following links; a file's fields must name the file
//! (`load`), or it is moved aside as corrupt; temp files are removed at
//! start only (`remove_leftovers`), and GC of a network reads that
//! network's files only, removing nothing.

use super::*;

/// Where unreadable intent files are moved.
pub(crate) const CORRUPT_DIR: &str = "corrupt";

pub(super) const SUFFIX: &str = ".json";

/// An intent file found at start.
#[derive(Debug)]
pub(crate) enum IntentFile {
    /// A usable intent.
    Intent(PathBuf, Box<Intent>),
    /// A file that could not be read (already moved aside).
    Corrupt(PathBuf, String),
}

impl Intents {
    pub(super) fn path(&self, network: &str, container_id: &str, ifname: &str) -> PathBuf {
        // The names were validated: no '/', no ':', never "." or "..".
        self.dir
            .join(format!("{network}:{container_id}:{ifname}{SUFFIX}"))
    }

    /// Writes the intent's file durably (temp file, fsync, rename, fsync of
    /// the dir: [`durable::write_atomic`]).
    pub(crate) async fn write(&self, intent: &Intent) -> io::Result<()> {
        let path = self.path(&intent.network, &intent.rt.container_id, &intent.rt.ifname);
        let bytes = intent.encode();
        let storage = self.storage.clone();
        blocking(move || {
            Ok(durable::write_atomic_on(
                &*storage, &path, &bytes, 0o600, true,
            )?)
        })
        .await
    }

    /// An attachment's intent, if there is a readable one.
    pub(crate) async fn read(
        &self,
        network: &str,
        container_id: &str,
        ifname: &str,
    ) -> Option<Intent> {
        let path = self.path(network, container_id, ifname);
        blocking(move || {
            Ok(durable::read_nofollow(&path)
                .ok()
                .and_then(|b| Intent::decode(&b).ok()))
        })
        .await
        .ok()
        .flatten()
    }

    /// Whether an attachment has an intent.
    #[cfg(test)]
    pub(crate) async fn exists(&self, network: &str, container_id: &str, ifname: &str) -> bool {
        let k = key(network, container_id, ifname);
        if lock(&self.journal)
            .open
            .values()
            .any(|(open, _)| *open == k)
        {
            return true;
        }
        let path = self.path(network, container_id, ifname);
        blocking(move || Ok(std::fs::symlink_metadata(&path).is_ok()))
            .await
            .unwrap_or(false)
    }

    /// The regular files in the dir, sorted by name.
    pub(super) fn names(&self) -> io::Result<Vec<String>> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(ctx(&self.dir, "read directory", e)),
        };
        let mut names: Vec<String> = entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        Ok(names)
    }

    /// The intent in file `name`, checked against its name.
    pub(super) fn load(&self, name: &str) -> Result<Intent, String> {
        let path = self.dir.join(name);
        let i = durable::read_nofollow(&path)
            .map_err(|e| e.to_string())
            .and_then(|b| Intent::decode(&b))?;
        let want = self.path(&i.network, &i.rt.container_id, &i.rt.ifname);
        if want == path {
            Ok(i)
        } else {
            Err(format!(
                "its fields name another attachment ({})",
                want.display()
            ))
        }
    }

    /// At start only, before any request runs: removes the temp files of
    /// writes that never finished (no plugin ran for them;
    /// [`durable::remove_leftovers`]). At any other time this would remove
    /// the temp file of an ADD being recorded. Returns how many were removed.
    pub(crate) fn remove_leftovers(&self) -> io::Result<usize> {
        Ok(durable::remove_leftovers(&*self.storage, &self.dir)?)
    }

    /// Every intent file, oldest name first; unreadable ones are moved to
    /// `intents/corrupt/` and reported. At start only (see the module docs).
    pub(crate) fn scan(&self) -> io::Result<Vec<IntentFile>> {
        let mut out = Vec::new();
        for name in self.names()? {
            if name.starts_with('.') || !name.ends_with(SUFFIX) {
                continue;
            }
            let path = self.dir.join(&name);
            match self.load(&name) {
                Ok(i) => out.push(IntentFile::Intent(path, Box::new(i))),
                Err(reason) => {
                    self.move_aside(&path);
                    out.push(IntentFile::Corrupt(path, reason));
                }
            }
        }
        Ok(out)
    }

    /// The intents of one network (for GC, under the network's exclusive
    /// gate): only its own `<network>:*.json` files are read, and nothing
    /// is removed or moved. An unreadable one is skipped with a warning
    /// (the next start moves it aside).
    pub(crate) async fn of_network(&self, network: &str) -> Vec<Intent> {
        let this = self.clone();
        let prefix = format!("{network}:");
        let res = blocking(move || {
            let mut out = Vec::new();
            for name in this.names()? {
                if !name.starts_with(&prefix) || !name.ends_with(SUFFIX) {
                    continue;
                }
                match this.load(&name) {
                    Ok(i) => out.push(i),
                    Err(reason) => {
                        tracing::warn!(file = %this.dir.join(&name).display(), %reason, "unreadable ADD intent skipped by GC");
                    }
                }
            }
            Ok(out)
        })
        .await;
        res.unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot list the ADD intents for GC");
            Vec::new()
        })
    }

    pub(super) fn move_aside(&self, path: &Path) {
        if let Err(e) = durable::move_aside(&*self.storage, path, &self.dir.join(CORRUPT_DIR)) {
            tracing::warn!(file = %path.display(), error = %e, "cannot move unreadable intent aside");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn write_scan_remove() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let mut rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        rt.args.push("K", "V");
        rt.capability_args
            .insert("n", serde_json::from_str("18446744073709551617").unwrap());
        let i = Intent::new("net-a", &rt, br#"{"name":"net-a"}"#.to_vec());
        intents.write(&i).await.unwrap();
        assert!(intents.exists("net-a", "c-1", "eth0").await);
        let found = intents.scan().unwrap();
        match found.as_slice() {
            [IntentFile::Intent(p, back)] => {
                assert_eq!(**back, i);
                assert!(p.ends_with("net-a:c-1:eth0.json"));
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(intents.of_network("net-a").await.len(), 1);
        assert!(intents.of_network("net-b").await.is_empty());
        assert!(intents.remove("net-a", "c-1", "eth0").await.unwrap());
        assert!(!intents.remove("net-a", "c-1", "eth0").await.unwrap());
        assert!(intents.scan().unwrap().is_empty());
    }

    /// GC of one network reads its own files only and never removes a temp
    /// file (another ADD may be writing it) or moves another network's
    /// unreadable file; leftovers are removed by the start-only cleanup.
    #[tokio::test]
    async fn of_network_touches_nothing_and_leftovers_go_at_start_only() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let d = dir.path().join(INTENTS_DIR);
        let rt = RuntimeConf::new("c-1", "/run/netns/x", "eth0");
        intents
            .write(&Intent::new("a", &rt, b"{}".to_vec()))
            .await
            .unwrap();
        intents
            .write(&Intent::new("ab", &rt, b"{}".to_vec()))
            .await
            .unwrap();
        let tmp = d.join(".b:c-2:eth0.json.tmp-1");
        let other_bad = d.join("b:c-3:eth0.json");
        std::fs::write(&tmp, b"half").unwrap();
        std::fs::write(&other_bad, b"{not json").unwrap();

        let got = intents.of_network("a").await;
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].network, "a");
        assert!(intents.of_network("b").await.is_empty());
        assert!(
            tmp.exists(),
            "GC removed a temp file of an ADD being recorded"
        );
        assert!(other_bad.exists(), "GC moved another network's file");
        assert!(!d.join(CORRUPT_DIR).exists());

        assert_eq!(intents.remove_leftovers().unwrap(), 1);
        assert!(!tmp.exists());
        assert!(other_bad.exists());
    }

    /// The longest attachment names requests may carry: the intent's file
    /// name is 5 bytes longer than the cache's, and its temp file's name
    /// must still fit in 255 bytes.
    #[tokio::test]
    async fn the_longest_names_get_an_intent() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let net = "n".repeat(100);
        let cid = "c".repeat(crate::decode::MAX_ATTACHMENT_NAME - 100 - 2 - 5);
        let rt = RuntimeConf::new(&cid, "/run/netns/x", "eth01");
        intents
            .write(&Intent::new(&net, &rt, b"{}".to_vec()))
            .await
            .unwrap();
        assert!(intents.exists(&net, &cid, "eth01").await);
    }

    #[test]
    fn corrupt_files_are_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let intents = Intents::new(dir.path());
        intents.prepare().unwrap();
        let bad = dir.path().join(INTENTS_DIR).join("n:c:eth0.json");
        std::fs::write(&bad, b"{not json").unwrap();
        match intents.scan().unwrap().as_slice() {
            [IntentFile::Corrupt(p, _)] => assert_eq!(p, &bad),
            other => panic!("{other:?}"),
        }
        assert!(!bad.exists());
        assert_eq!(
            std::fs::read_dir(dir.path().join(INTENTS_DIR).join(CORRUPT_DIR))
                .unwrap()
                .count(),
            1
        );
    }
}
