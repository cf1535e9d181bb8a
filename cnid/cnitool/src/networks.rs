//! `cnitool networks`: the networks of the conf dir (or cnid's).

use cnid::api::NetworksResponse;

use crate::backend::Backend;
use crate::report;

/// Prints one line per usable network, in conf-dir order (the first is the
/// default network go-cni and ocicni pick), with its version, plugins,
/// capabilities and file; then the files that could not be used, and why.
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
    if r.networks.is_empty() {
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
    for e in &r.errors {
        out.push_str(&format!("unusable: {}: {}\n", e.file, e.reason));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use cnid::api::{ConfigError, NetworkInfo};

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
        };
        assert_eq!(
            render(&r),
            "NAME         VERSION  PLUGINS         CAPABILITIES  FILE\n\
             a (default)  1.0.0    bridge,portmap  portMappings  /etc/cni/net.d/a.conflist\n\
             bb           1.0.0    bridge,portmap  -             /etc/cni/net.d/bb.conflist\n\
             unusable: /etc/cni/net.d/x.conf: not valid JSON\n"
        );
    }
}
