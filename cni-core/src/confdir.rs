//! Scanning a conf dir and finding a network by name, as libcni's
//! `LoadNetworkConf` does, without letting one bad file hide the others.
//!
//! Rules (the CNI spec's conf dir, libcni's `LoadNetworkConf`):
//! - `*.conflist` files are lists; `*.conf` and `*.json` files are single
//!   plugin configurations, upconverted to a list of one.
//! - Files are taken in byte-wise order of their names (`10-a` before `9-b`).
//! - **Lookup by name** ([`load_network`], [`ConfDirScan::find`]) follows
//!   libcni: the first `.conflist` whose `name` matches wins; only when none
//!   does, the `.conf`/`.json` files are searched.
//! - **The default network** ([`ConfDirScan::default_network`]) follows
//!   go-cni, ocicni and the kubelet: all three extensions sorted together,
//!   the first file that loads. So `00-multus.conf` beside
//!   `10-calico.conflist` makes Multus the default, as a node expects.
//! - A file that does not parse is skipped with a warning and named in the
//!   "not found" error (`docs/decisions.md` D9; libcni fails on the first
//!   bad file).
//! - A directory with no configuration file at all gives [`Error::NoConfigs`]
//!   (which says when the directory does not exist), distinct from
//!   [`Error::NetworkNotFound`] (which lists the networks the directory
//!   holds and suggests the closest name).
//! - Symbolic links are followed only when they stay inside the conf dir
//!   (Kubernetes ConfigMap mounts link into `..data/`); a link that points
//!   outside is skipped, so a conf dir writer cannot make us parse arbitrary
//!   files elsewhere.
//!
//! ```no_run
//! use cni_core::confdir;
//! use std::path::Path;
//!
//! let list = confdir::load_network(Path::new("/etc/cni/net.d"), "mynet")?;
//! println!("{} plugins at {}", list.plugins().len(), list.version());
//! # Ok::<(), cni_core::Error>(())
//! ```

use std::path::{Path, PathBuf};

use crate::config::{NetworkConfigList, PluginConfig};
use crate::error::{Error, SkippedFile};

/// Extensions of network configuration lists.
pub const LIST_EXTENSIONS: &[&str] = &["conflist"];
/// Extensions of single plugin configurations.
pub const SINGLE_EXTENSIONS: &[&str] = &["conf", "json"];

/// The regular files (or links to regular files inside `dir`) in `dir` whose
/// extension is one of `extensions`, sorted byte-wise by name. A missing
/// directory has no files.
pub fn files_with_extensions(dir: &Path, extensions: &[&str]) -> Result<Vec<PathBuf>, Error> {
    Ok(scan_files(dir, extensions)?.0)
}

/// Like [`files_with_extensions`] but also returns the entries it refused
/// (links leaving the dir, unreadable entries).
fn scan_files(dir: &Path, extensions: &[&str]) -> Result<(Vec<PathBuf>, Vec<SkippedFile>), Error> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), Vec::new())),
        Err(source) => {
            return Err(Error::Io {
                path: dir.to_owned(),
                source,
            });
        }
    };
    let mut names: Vec<std::ffi::OsString> = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| Error::Io {
            path: dir.to_owned(),
            source,
        })?;
        names.push(entry.file_name());
    }
    // Byte-wise order, as Go's sort.Strings.
    names.sort_by(|a, b| a.as_encoded_bytes().cmp(b.as_encoded_bytes()));

    let mut canonical_dir: Option<PathBuf> = None;
    let mut files = Vec::new();
    let mut skipped = Vec::new();
    for name in names {
        let path = dir.join(&name);
        if !has_extension(&path, extensions) {
            continue;
        }
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                skipped.push(SkippedFile::new(path, format!("cannot stat: {e}")));
                continue;
            }
        };
        if meta.file_type().is_symlink() {
            let dir_real = match &canonical_dir {
                Some(d) => d.clone(),
                None => {
                    let d = std::fs::canonicalize(dir).map_err(|source| Error::Io {
                        path: dir.to_owned(),
                        source,
                    })?;
                    canonical_dir = Some(d.clone());
                    d
                }
            };
            match std::fs::canonicalize(&path) {
                Ok(target) if target.starts_with(&dir_real) && target.is_file() => files.push(path),
                Ok(target) if !target.starts_with(&dir_real) => skipped.push(SkippedFile::new(
                    path,
                    format!(
                        "symbolic link to {} points outside {}",
                        target.display(),
                        dir.display()
                    ),
                )),
                Ok(_) => {} // a link to a directory: not a config file
                Err(e) => skipped.push(SkippedFile::new(
                    path,
                    format!("dangling symbolic link: {e}"),
                )),
            }
        } else if meta.is_file() {
            files.push(path);
        }
    }
    Ok((files, skipped))
}

/// One usable network found in a conf dir.
#[derive(Debug, Clone)]
pub struct FoundNetwork {
    /// The file it came from.
    pub path: PathBuf,
    /// The parsed list (a `.conf`/`.json` upconverted).
    pub list: NetworkConfigList,
}

impl FoundNetwork {
    /// Whether it came from a `.conflist` file (lookup by name prefers those).
    pub fn is_list_file(&self) -> bool {
        has_extension(&self.path, LIST_EXTENSIONS)
    }
}

fn has_extension(path: &Path, extensions: &[&str]) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| extensions.contains(&e))
}

/// Everything in a conf dir, parsed: networks in file-name order (all
/// extensions together), and the files skipped.
#[derive(Debug, Clone, Default)]
pub struct ConfDirScan {
    /// Parsed networks in byte-wise order of their file names, `.conflist`,
    /// `.conf` and `.json` together (go-cni's order). A name may appear more
    /// than once; [`ConfDirScan::find`] picks among them by libcni's rule.
    pub networks: Vec<FoundNetwork>,
    /// Files that could not be used, with the reason.
    pub skipped: Vec<SkippedFile>,
    /// How many configuration files (by extension) the dir holds.
    pub files_seen: usize,
}

impl ConfDirScan {
    /// The network `name` as [`load_network`] finds it (libcni's rule): the
    /// first `.conflist` with that name, else the first `.conf`/`.json`.
    pub fn find(&self, name: &str) -> Option<&FoundNetwork> {
        let mut named = self.networks.iter().filter(|n| n.list.name() == name);
        let first = named.next()?;
        if first.is_list_file() {
            return Some(first);
        }
        Some(named.find(|n| n.is_list_file()).unwrap_or(first))
    }

    /// The default network, as go-cni, ocicni and the kubelet choose it: the
    /// first file, by name across all extensions, that loads.
    pub fn default_network(&self) -> Option<&FoundNetwork> {
        self.networks.first()
    }

    /// One entry per network name, each the one [`ConfDirScan::find`]
    /// returns, in the file-name order of the name's first file (so the
    /// first entry is the default network's name).
    pub fn unique(&self) -> Vec<&FoundNetwork> {
        let mut seen: Vec<&str> = Vec::new();
        let mut out = Vec::new();
        for n in &self.networks {
            let name = n.list.name();
            if !seen.contains(&name) {
                seen.push(name);
                out.extend(self.find(name));
            }
        }
        out
    }

    /// The files of networks that [`ConfDirScan::unique`] does not return:
    /// other files with the same name as a chosen one.
    pub fn shadowed(&self, chosen: &FoundNetwork) -> Vec<&Path> {
        self.networks
            .iter()
            .filter(|n| n.list.name() == chosen.list.name() && n.path != chosen.path)
            .map(|n| n.path.as_path())
            .collect()
    }
}

/// Reading configuration files. The types and their parsing live in
/// [`crate::config`], which reads no file; this module depends on it, not
/// the reverse.
impl PluginConfig {
    /// Reads and parses a plugin configuration file.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let bytes = read_file(path)?;
        PluginConfig::from_bytes(&bytes, Some(path))
    }
}

impl NetworkConfigList {
    /// Reads a `.conflist` file and, unless `loadOnlyInlinedPlugins` is true,
    /// appends the plugins of `<dir of file>/<network name>/*.conf` (sorted
    /// byte-wise; spec 1.1.0). A list that ends up with no plugins is an error.
    pub fn from_file(path: &Path) -> Result<Self, Error> {
        let bytes = read_file(path)?;
        let mut list = NetworkConfigList::from_bytes(&bytes, Some(path))?;
        if !list.load_only_inlined_plugins() {
            let dir = path.parent().unwrap_or(Path::new("."));
            list.append_plugin_files(dir)?;
        }
        list.require_plugins()
    }

    /// Appends the plugins of `<conf_dir>/<network name>/*.conf`.
    ///
    /// The network name is checked first, so a name like `../x` cannot make
    /// us read outside the conf dir.
    pub fn append_plugin_files(&mut self, conf_dir: &Path) -> Result<(), Error> {
        if self.name().is_empty() || crate::validate::network_name(self.name()).is_err() {
            // Not a usable network name: there can be no plugin dir for it.
            return Ok(());
        }
        let plugin_dir = conf_dir.join(self.name());
        for file in files_with_extensions(&plugin_dir, &["conf"])? {
            self.push_plugin(PluginConfig::from_file(&file)?);
        }
        Ok(())
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|source| Error::Io {
        path: path.to_owned(),
        source,
    })
}

fn load_single(path: &Path) -> Result<NetworkConfigList, Error> {
    NetworkConfigList::from_plugin(PluginConfig::from_file(path)?)
}

fn warn_skipped(s: &SkippedFile) {
    tracing::warn!(file = %s.path.display(), reason = %s.reason, "skipping network configuration file");
}

/// Parses every configuration file in `dir`. Unparsable files are skipped
/// with a warning (and listed in [`ConfDirScan::skipped`]).
pub fn scan(dir: &Path) -> Result<ConfDirScan, Error> {
    let (lists, mut skipped) = scan_files(dir, LIST_EXTENSIONS)?;
    let (singles, skipped_singles) = scan_files(dir, SINGLE_EXTENSIONS)?;
    skipped.extend(skipped_singles);
    let mut out = ConfDirScan {
        files_seen: lists.len() + singles.len() + skipped.len(),
        ..Default::default()
    };
    for s in &skipped {
        warn_skipped(s);
    }
    out.skipped = skipped;
    let mut files: Vec<PathBuf> = lists.into_iter().chain(singles).collect();
    files.sort_by(|a, b| {
        let name = |p: &PathBuf| p.file_name().map(|n| n.as_encoded_bytes().to_vec());
        name(a).cmp(&name(b))
    });
    for path in files {
        let loaded = if has_extension(&path, LIST_EXTENSIONS) {
            NetworkConfigList::from_file(&path)
        } else {
            load_single(&path)
        };
        match loaded {
            Ok(list) => out.networks.push(FoundNetwork { path, list }),
            Err(e) => {
                let s = SkippedFile::from_error(path, &e);
                warn_skipped(&s);
                out.skipped.push(s);
            }
        }
    }
    Ok(out)
}

/// Loads `paths` in order until one holds the network `name`; files that
/// do not load are warned about and added to `skipped`.
/// The names of the lists that load but are not `name` go to `available`.
fn first_named(
    paths: Vec<PathBuf>,
    load: fn(&Path) -> Result<NetworkConfigList, Error>,
    name: &str,
    skipped: &mut Vec<SkippedFile>,
    available: &mut Vec<String>,
) -> Option<NetworkConfigList> {
    for path in paths {
        match load(&path) {
            Ok(list) if list.name() == name => return Some(list),
            Ok(list) => {
                if !available.iter().any(|n| n == list.name()) {
                    available.push(list.name().to_owned());
                }
            }
            Err(e) => {
                let s = SkippedFile::from_error(path, &e);
                warn_skipped(&s);
                skipped.push(s);
            }
        }
    }
    None
}

/// Finds the network named `name` in `dir` (see the module docs for the rules).
///
/// Unlike [`scan`], this stops at the first match, so files after it are
/// not parsed.
pub fn load_network(dir: &Path, name: &str) -> Result<NetworkConfigList, Error> {
    let (lists, mut skipped) = scan_files(dir, LIST_EXTENSIONS)?;
    for s in &skipped {
        warn_skipped(s);
    }
    let mut seen = lists.len() + skipped.len();
    let mut available = Vec::new();
    if let Some(list) = first_named(
        lists,
        NetworkConfigList::from_file,
        name,
        &mut skipped,
        &mut available,
    ) {
        return Ok(list);
    }
    let (singles, skipped_singles) = scan_files(dir, SINGLE_EXTENSIONS)?;
    for s in &skipped_singles {
        warn_skipped(s);
    }
    seen += singles.len() + skipped_singles.len();
    skipped.extend(skipped_singles);
    if let Some(list) = first_named(singles, load_single, name, &mut skipped, &mut available) {
        return Ok(list);
    }
    if seen == 0 {
        return Err(Error::NoConfigs {
            dir: dir.to_owned(),
            missing: !dir.exists(),
        });
    }
    Err(Error::NetworkNotFound {
        name: name.to_owned(),
        dir: dir.to_owned(),
        skipped,
        available,
    })
}
