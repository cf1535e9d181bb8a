//! Prints, for every network in a conf dir, the exact stdin each plugin would
//! receive for an ADD (the first plugin without `prevResult`, later plugins
//! with a placeholder where the previous plugin's result goes).
//!
//! ```text
//! cargo run -p cni-examples --bin show-stdin -- examples/net.d
//! ```
//!
//! Pure `cni-core`: nothing is executed, no root needed.

use std::path::PathBuf;
use std::process::ExitCode;

use cni_core::stdin::{StdinInput, list_plugin_stdin};
use cni_core::{CniArgs, RuntimeConf, confdir, env};
use serde_json::json;

fn main() -> ExitCode {
    let dir = PathBuf::from(
        std::env::args()
            .nth(1)
            .unwrap_or_else(|| "examples/net.d".into()),
    );
    let scan = match confdir::scan(&dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("show-stdin: {e}");
            return ExitCode::FAILURE;
        }
    };
    for skipped in &scan.skipped {
        eprintln!("show-stdin: skipped {skipped}");
    }
    if scan.networks.is_empty() {
        eprintln!(
            "show-stdin: no usable network configuration in {}",
            dir.display()
        );
        return ExitCode::FAILURE;
    }

    let mut rt = RuntimeConf::new("example-container", "/run/netns/example", "eth0");
    rt.args = CniArgs::parse("IgnoreUnknown=1;K8S_POD_NAME=example").expect("valid CNI_ARGS");
    rt.capability_args.insert(
        "portMappings",
        json!([{"hostPort": 18080, "containerPort": 80, "protocol": "tcp"}]),
    );
    // What the previous plugin returned; a real run chains the actual result.
    let placeholder =
        json!({"cniVersion": "<list version>", "note": "result of the previous plugin"});

    for found in scan.unique() {
        let list = &found.list;
        println!(
            "# network {:?} from {} (runs at CNI {})",
            list.name(),
            found.path.display(),
            list.version()
        );
        for (i, plugin) in list.plugins().iter().enumerate() {
            let prev = (i > 0).then_some(&placeholder);
            let stdin = match list_plugin_stdin(
                list,
                i,
                StdinInput::Attachment {
                    rt: &rt,
                    prev_result: prev,
                },
            ) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("show-stdin: {e}");
                    return ExitCode::FAILURE;
                }
            };
            println!("\n## plugin {} ({}), ADD", i + 1, plugin.describe());
            for (k, v) in env::plugin_env(
                cni_core::Command::Add,
                Some(&rt),
                "/opt/cni/bin:/usr/lib/cni",
            ) {
                println!("{k}={v}");
            }
            // The exact bytes the plugin reads.
            println!("{}", String::from_utf8_lossy(&stdin));
        }
        println!();
    }
    ExitCode::SUCCESS
}
