//! `cnitool networks`: the networks of the conf dir (or cnid's).

use cnid_api::NetworksResponse;

use crate::backend::Backend;
use crate::report;

/// Prints one line per loaded network, in conf-dir order (the first is the
/// default network go-cni and ocicni pick), with its version, plugins,
/// capabilities and file, `(unusable)` after the name of one that cannot
/// work now; then why each unusable network cannot, the files that could
/// not be used, and why.
pub(crate) async fn exec(backend: &impl Backend) -> anyhow::Result<()> {
    let answer = backend.networks().await?;
    report::print_stdout(&render(&answer))?;
    Ok(())
}

fn render(r: &NetworksResponse) -> String {
    let mut rows: Vec<[String; 5]> = vec![[
        "NAME".into(),
        "VERSION".into(),
        "PLUGINS".into(),
        "CAPABILITIES".into(),
        "FILE".into(),
    ]];
    for (i, n) in r.networks.iter().enumerate() {
        let mut name = n.name.clone();
        if i == 0 {
            name.push_str(" (default)");
        }
        if n.unusable.is_some() {
            name.push_str(" (unusable)");
        }
        rows.push([
            name,
            n.cni_version.clone(),
            n.plugins.join(","),
            if n.capabilities.is_empty() {
                "-".into()
            } else {
                n.capabilities.join(",")
            },
            n.file.clone(),
        ]);
    }
    let widths: Vec<usize> = (0..5)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    if r.conf_dir_missing {
        out.push_str(&format!("the conf dir {} does not exist\n", r.conf_dir));
    } else if r.networks.is_empty() {
        out.push_str(&format!("no usable network in {}\n", r.conf_dir));
    } else {
        for row in &rows {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(&format!("{cell:<w$}  ", w = widths[c]));
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    for n in &r.networks {
        if let Some(why) = &n.unusable {
            out.push_str(&format!("unusable: network {:?}: {why}\n", n.name));
        }
    }
    for e in &r.errors {
        out.push_str(&format!("unusable: {}: {}\n", e.file, e.reason));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnid_api::{ConfigError, NetworkInfo};

    #[test]
    fn default_first_then_unusable_files() {
        let info = |name: &str, caps: &[&str]| NetworkInfo {
            name: name.into(),
            file: format!("/etc/cni/net.d/{name}.conflist"),
            cni_version: "1.0.0".into(),
            plugins: vec!["bridge".into(), "portmap".into()],
            capabilities: caps.iter().map(|c| (*c).to_owned()).collect(),
            disable_check: false,
            disable_gc: false,
            shadowed: Vec::new(),
            config: None,
            unusable: None,
        };
        let r = NetworksResponse {
            conf_dir: "/etc/cni/net.d".into(),
            generation: 0,
            loaded_at_ms: 0,
            networks: vec![info("a", &["portMappings"]), info("bb", &[])],
            errors: vec![ConfigError {
                file: "/etc/cni/net.d/x.conf".into(),
                reason: "not valid JSON".into(),
            }],
            conf_dir_missing: false,
        };
        assert_eq!(
            render(&r),
            "NAME         VERSION  PLUGINS         CAPABILITIES  FILE\n\
             a (default)  1.0.0    bridge,portmap  portMappings  /etc/cni/net.d/a.conflist\n\
             bb           1.0.0    bridge,portmap  -             /etc/cni/net.d/bb.conflist\n\
             unusable: /etc/cni/net.d/x.conf: not valid JSON\n"
        );
        let mut degraded = r.clone();
        degraded.networks[0].unusable = Some("plugin \"bridge\" not found".into());
        assert_eq!(
            render(&degraded),
            "NAME                    VERSION  PLUGINS         CAPABILITIES  FILE\n\
             a (default) (unusable)  1.0.0    bridge,portmap  portMappings  /etc/cni/net.d/a.conflist\n\
             bb                      1.0.0    bridge,portmap  -             /etc/cni/net.d/bb.conflist\n\
             unusable: network \"a\": plugin \"bridge\" not found\n\
             unusable: /etc/cni/net.d/x.conf: not valid JSON\n"
        );
        let missing = NetworksResponse {
            networks: Vec::new(),
            errors: Vec::new(),
            conf_dir_missing: true,
            ..r
        };
        assert_eq!(
            render(&missing),
            "the conf dir /etc/cni/net.d does not exist\n"
        );
    }
}
